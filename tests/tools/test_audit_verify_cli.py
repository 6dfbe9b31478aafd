"""`kvguard audit verify` as an auditor runs it: each verdict's exit code and --json fields, on
logs written by `kvguard generate --audit-log` and then edited the ways the corruption matrix
(tests/audit/verifier_test.cc) covers in-process. ctest ignores the exit status of the CLI tests
that match output, so the codes are checked here.

Also the restart rule (audit/log.h): a record appended after a clean stop makes the next start
refuse the log, and the log is left as it was."""

import hashlib
import json
import os
import shutil
import subprocess

import pytest

KVGUARD = os.environ.get("KVGUARD_BIN", "build/default/tools/kvguard")


def run(*args):
    return subprocess.run([KVGUARD, *args], capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    """A log of two `generate` runs (each a clean stop), its public key."""
    root = tmp_path_factory.mktemp("audit")
    log, key, pub = root / "log", root / "signing.key", root / "pub.pem"
    for _ in range(2):
        r = run("generate", "--model", "tiny", "--max-tokens", "4", "--kv-cache-bytes", "8M",
                "--audit-log", str(log), "--audit-signing-key", str(key))
        assert r.returncode == 0, r.stderr
    r = run("audit", "pubkey", "--signing-key", str(key), "--out", str(pub))
    assert r.returncode == 0, r.stderr
    return root, log, key, pub


def copy_log(clean, name):
    root, log, _, _ = clean
    dst = root / name
    shutil.copytree(log, dst)
    witness = root / "log.witness"  # the writer's own witness of what it signed
    if witness.exists():
        shutil.copy(witness, root / (name + ".witness"))
    return dst


def lines_of(log):
    return (log / "audit-000001.jsonl").read_text().splitlines()


def write_lines(log, lines):
    (log / "audit-000001.jsonl").write_text("".join(l + "\n" for l in lines))


def forged_after(lines):
    """A record chained to the last record of `lines`, hash recomputed (FORMAT.md)."""
    last = next(json.loads(l) for l in reversed(lines) if '"seq"' in l)
    body = ('{"v":1,"seq":%d,"time_ns":%d,"type":"mode_change","instance":"%s","tenant":"acme",'
            '"mode_from":"enforce","mode_to":"off","actor":"admin","prev":"%s"'
            % (last["seq"] + 1, last["time_ns"] + 1, last["instance"], last["hash"]))
    digest = hashlib.sha256(b"kvguard/audit/record/v1\n" + body.encode()).hexdigest()
    return body + ',"hash":"%s"}' % digest


def verify(log, pub, *extra):
    r = run("audit", "verify", str(log), "--pubkey", str(pub), "--json", *extra)
    report = json.loads(r.stdout) if r.stdout.strip() else None
    return r.returncode, report, r


def test_clean_log_is_valid_exit_0(clean):
    _, log, _, pub = clean
    code, report, r = verify(log, pub)
    assert code == 0, r.stdout + r.stderr
    assert report["verdict"] == "valid" and report["first_bad"] is None


def test_cut_after_a_record_is_an_unsigned_tail_exit_3_unless_allowed(clean):
    _, _, _, pub = clean
    log = copy_log(clean, "cut")
    lines = lines_of(log)
    write_lines(log, lines[:-1])  # the final checkpoint gone: the second run is unsigned
    code, report, r = verify(log, pub)
    assert code == 3, r.stdout + r.stderr
    assert report["verdict"] == "unsigned tail"
    code, report, r = verify(log, pub, "--allow-unsigned-tail")
    assert code == 0, r.stdout + r.stderr  # twin: the auditor tolerates a live log's tail


def test_forged_append_is_an_unsigned_tail_and_the_next_start_refuses_it(clean):
    _, _, key, pub = clean
    log = copy_log(clean, "forged")
    lines = lines_of(log)
    write_lines(log, lines + [forged_after(lines)])
    code, report, r = verify(log, pub)
    assert code == 3, r.stdout + r.stderr
    before = lines_of(log)
    r = run("generate", "--model", "tiny", "--max-tokens", "4", "--kv-cache-bytes", "8M",
            "--audit-log", str(log), "--audit-signing-key", str(key))
    assert r.returncode != 0
    assert "clean stop" in r.stderr
    assert lines_of(log) == before  # nothing signed, nothing written
    code, _, r = verify(log, pub)
    assert code == 3, r.stdout + r.stderr


def test_edited_record_is_invalid_exit_1_and_located(clean):
    _, _, _, pub = clean
    log = copy_log(clean, "edited")
    lines = lines_of(log)
    assert '"service_start"' in lines[0]
    lines[0] = lines[0].replace("service_start", "service_stort")
    write_lines(log, lines)
    code, report, r = verify(log, pub)
    assert code == 1, r.stdout + r.stderr
    assert report["verdict"] == "invalid"
    assert report["first_bad"]["file"] == "audit-000001.jsonl"
    assert report["first_bad"]["line"] == 1


def test_stale_log_exit_4_and_fresh_twin(clean):
    _, log, _, pub = clean
    code, report, r = verify(log, pub, "--max-age", "1s", "--now", "2099-01-01T00:00:00Z")
    assert code == 4, r.stdout + r.stderr
    assert report["verdict"] == "stale"
    code, _, r = verify(log, pub, "--max-age", "87600h")
    assert code == 0, r.stdout + r.stderr


def test_unreadable_log_exit_5(clean):
    root, _, _, pub = clean
    code, _, r = verify(root / "no-such-log", pub)
    assert code == 5, r.stdout + r.stderr
