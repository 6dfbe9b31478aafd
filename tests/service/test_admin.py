"""The admin API and `kvguard tenant`: a mode change lands in the audit log with before and
after; reload applies limits and keys (audited); key rotation is audited."""

import os
import subprocess
import time

import httpx
import pytest

from conftest import ADMIN_KEY, KVGUARD, MODEL, TENANTS, Server, digest, write_tenants


def wait_for_records(server, *filters, n=1, timeout=10):
    deadline = time.time() + timeout
    while time.time() < deadline:
        records = server.audit_records(*filters)
        if len(records) >= n:
            return records
        time.sleep(0.1)
    raise AssertionError(f"no audit record {filters}")


def tenant_cli(server, *args, key=ADMIN_KEY):
    env = dict(os.environ, KVGUARD_ADMIN_KEY=key)
    return subprocess.run([KVGUARD, "tenant", *args, "--admin", server.admin], env=env,
                          capture_output=True, text=True)


def test_tenant_list_and_set_mode_audited(server):
    out = tenant_cli(server, "list")
    assert out.returncode == 0, out.stderr
    assert "acme" in out.stdout and "enforce" in out.stdout and "strict" in out.stdout
    out = tenant_cli(server, "set-mode", "gamma", "strict")
    assert out.returncode == 0, out.stderr
    assert "gamma: enforce -> strict" in out.stdout
    records = wait_for_records(server, "--type", "mode_change", "--tenant", "gamma")
    assert records[-1]["mode_from"] == "enforce"
    assert records[-1]["mode_to"] == "strict"
    assert records[-1]["actor"] == "admin"
    # The tenant now runs strict and is still served.
    r = server.client("gamma").completions.create(model=MODEL, prompt="x", max_tokens=2)
    assert r.usage.completion_tokens == 2
    assert tenant_cli(server, "set-mode", "gamma", "enforce").returncode == 0
    # Twins: a bad mode, an unknown tenant and a wrong admin key change nothing.
    assert tenant_cli(server, "set-mode", "gamma", "paranoid").returncode == 1
    assert tenant_cli(server, "set-mode", "nobody", "off").returncode == 1
    out = tenant_cli(server, "set-mode", "gamma", "off", key="wrong")
    assert out.returncode == 1 and "admin key" in out.stderr
    assert len(server.audit_records("--type", "mode_change", "--tenant", "gamma")) == 2


def test_reload_applies_limits_and_keys_audited(server):
    tenants = {k: dict(v) for k, v in TENANTS.items()}
    tenants["delta"]["key"] = "key-delta-rotated"
    write_tenants(server.tenants_file, {"concurrent_requests": 64, "tokens_per_request": 4},
                  tenants)
    try:
        r = server.admin_call("POST", "/admin/reload")
        assert r.status_code == 200, r.text
        # The new limit holds, the new key works and the old one no longer does.
        c = server.client("acme")
        try:
            c.completions.create(model=MODEL, prompt="x", max_tokens=5)
            raise AssertionError("max_tokens above the reloaded limit was accepted")
        except Exception as e:  # openai.BadRequestError
            assert "tokens_per_request" in str(e)
        import openai
        new = openai.OpenAI(base_url=server.base + "/v1", api_key="key-delta-rotated",
                            max_retries=0)
        assert new.completions.create(model=MODEL, prompt="x", max_tokens=2).usage
        try:
            server.client("delta").completions.create(model=MODEL, prompt="x", max_tokens=2)
            raise AssertionError("the replaced key still works")
        except openai.AuthenticationError:
            pass
        records = wait_for_records(server, "--type", "config_change", "--tenant", "delta")
        assert "api_keys [" + digest("key-delta")[:15] + "] -> [" + \
            digest("key-delta-rotated")[:15] + "]" in records[-1]["detail"]
        assert "limits.tokens_per_request 480 -> 4" in records[-1]["detail"]
    finally:
        write_tenants(server.tenants_file)
        assert server.admin_call("POST", "/admin/reload").status_code == 200


def test_reload_refuses_a_bad_file(server):
    server.tenants_file.write_text('{"tenants": [{"name": "acme", "mdoe": "off"}]}')
    try:
        r = server.admin_call("POST", "/admin/reload")
        assert r.status_code == 409
        assert "unknown key 'mdoe'" in r.json()["error"]["message"]
    finally:
        write_tenants(server.tenants_file)
    assert server.client("acme").completions.create(model=MODEL, prompt="x", max_tokens=2)


def test_rotate_tag_key_audited(server):
    before = len(server.audit_records("--type", "key_rotated"))
    r = server.admin_call("POST", "/admin/rotate-tag-key")
    assert r.status_code == 200
    assert r.json()["key_id_to"] == r.json()["key_id_from"] + 1
    records = wait_for_records(server, "--type", "key_rotated", n=before + 1)
    assert records[-1]["actor"] == "admin"
    # Requests still verify under the new key.
    assert server.client("beta").completions.create(model=MODEL, prompt="x", max_tokens=3)


@pytest.fixture(scope="module")
def exposed_admin(tmp_path_factory):
    """A server whose admin listener is not loopback-only (0.0.0.0), with no --metrics-auth:
    /metrics then needs the admin key by default."""
    s = Server(tmp_path_factory.mktemp("exposed"), extra=("--admin-host", "0.0.0.0"))
    yield s
    assert s.stop() == 0, s.stderr_path.read_text()


def test_metrics_need_the_admin_key_off_loopback(exposed_admin):
    s = exposed_admin
    for headers in ({}, {"Authorization": "Bearer wrong"},
                    {"Authorization": f"Bearer {TENANTS['acme']['key']}"}):
        r = httpx.get(s.admin + "/metrics", headers=headers, timeout=10)
        assert r.status_code == 401, (headers, r.text)
        assert "kvguard_tenant_in_flight" not in r.text
        assert r.json()["error"]["code"] == "invalid_api_key"
    r = s.admin_call("GET", "/metrics")
    assert r.status_code == 200
    assert "kvguard_tenant_in_flight" in r.text
    # /readyz there: ready or not to anyone, the detail only with the key.
    assert httpx.get(s.admin + "/readyz", timeout=10).json() == {"ready": True}
    assert s.admin_call("GET", "/readyz").json()["audit_log"] == "ok"


def test_metrics_auth_flag_overrides_the_default(tmp_path):
    s = Server(tmp_path, extra=("--metrics-auth", "admin"))  # loopback, key required anyway
    try:
        assert httpx.get(s.admin + "/metrics", timeout=10).status_code == 401
        assert s.admin_call("GET", "/metrics").status_code == 200
    finally:
        assert s.stop() == 0, s.stderr_path.read_text()


def test_metrics_open_on_loopback_by_default(server):
    r = httpx.get(server.admin + "/metrics", timeout=10)
    assert r.status_code == 200 and "kvguard_requests_total" in r.text


def test_bad_metrics_auth_flag_is_refused(tmp_path):
    out = subprocess.run([KVGUARD, "serve", "--metrics-auth", "sometimes", "--tenants", "x"],
                         capture_output=True, text=True)
    assert out.returncode == 2 and "--metrics-auth" in out.stderr


def serve_refuses(tmp_path, tenants_mode=0o600, admin_mode=0o600, link=False):
    """Runs `kvguard serve` on files with these modes; returns (exit code, stderr) if it exits
    at once, or None if it started (then stops it)."""
    tenants = tmp_path / "tenants.json"
    write_tenants(tenants)
    os.chmod(tenants, tenants_mode)
    admin = tmp_path / "admin.key"
    admin.write_text(digest(ADMIN_KEY) + "\n")
    os.chmod(admin, admin_mode)
    if link:
        os.symlink(tenants, tmp_path / "link.json")
        tenants = tmp_path / "link.json"
    proc = subprocess.Popen([KVGUARD, "serve", "--model", MODEL, "--kv-cache-bytes", "16M",
                             "--tenants", str(tenants), "--admin-key-file", str(admin),
                             "--port", "0", "--admin-port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()  # the listening line, or EOF when it exits
    if "listening on" in line:
        proc.terminate()
        proc.communicate(timeout=60)
        return None
    _, err = proc.communicate(timeout=60)
    return proc.returncode, err


@pytest.mark.parametrize("what", ["tenants 0644", "tenants 0620", "admin key 0666", "symlink"])
def test_serve_refuses_tenants_and_admin_key_files_others_can_touch(tmp_path, what):
    kw = {"tenants 0644": dict(tenants_mode=0o644), "tenants 0620": dict(tenants_mode=0o620),
          "admin key 0666": dict(admin_mode=0o666), "symlink": dict(link=True)}[what]
    result = serve_refuses(tmp_path, **kw)
    assert result is not None, f"served with {what}"
    code, err = result
    assert code == 1
    assert ("symbolic link" in err) if what == "symlink" else ("chmod 600" in err), err


def test_serve_takes_private_files(tmp_path):
    """The twin: the same files, 0600 and ours, are served."""
    assert serve_refuses(tmp_path) is None


def test_reload_refuses_a_tenants_file_others_can_write(server):
    tenants = {k: dict(v) for k, v in TENANTS.items()}
    tenants["acme"]["mode"] = "off"
    write_tenants(server.tenants_file, tenants=tenants)
    os.chmod(server.tenants_file, 0o666)
    try:
        r = server.admin_call("POST", "/admin/reload")
        assert r.status_code == 409, r.text
        assert "chmod 600" in r.json()["error"]["message"]
        listed = {t["id"]: t["mode"] for t in server.admin_call("GET", "/admin/tenants")
                  .json()["tenants"]}
        assert listed["acme"] == "enforce"
    finally:
        write_tenants(server.tenants_file)  # 0600 again
    assert server.admin_call("POST", "/admin/reload").status_code == 200


def test_a_downgrade_is_on_disk_when_the_reply_comes(server):
    """enforce -> off weakens isolation: its record is fsync'd before the change applies, so it
    is in the log's files the moment the reply arrives (no waiting for a batch)."""
    before = len(server.audit_records("--type", "mode_change", "--tenant", "acme"))
    r = server.admin_call("PUT", "/admin/tenants/acme/mode", json={"mode": "off"})
    assert r.status_code == 200, r.text
    try:
        records = server.audit_records("--type", "mode_change", "--tenant", "acme")
        assert len(records) == before + 1
        assert (records[-1]["mode_from"], records[-1]["mode_to"]) == ("enforce", "off")
    finally:
        r = server.admin_call("PUT", "/admin/tenants/acme/mode", json={"mode": "enforce"})
        assert r.status_code == 200, r.text
    # The upgrade back is on disk at once too.
    records = server.audit_records("--type", "mode_change", "--tenant", "acme")
    assert (records[-1]["mode_from"], records[-1]["mode_to"]) == ("off", "enforce")
