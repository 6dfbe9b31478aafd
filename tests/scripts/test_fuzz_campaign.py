"""tests/scripts/test_fuzz_campaign.py: scripts/fuzz-campaign's own logic, without a fuzz build.

A crash is labelled by replaying it (not by the campaign's log, which interleaves every crash
it met), --update-seeds leaves at most --max-seeds inputs per target, and bad arguments are
refused before anything runs. The fuzzers are stood in for by small shell scripts, which is
all the logic under test sees of them: an executable, its exit status and its stderr."""
import importlib.machinery
import importlib.util
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "fuzz-campaign"


def load_campaign():
    loader = importlib.machinery.SourceFileLoader("fuzz_campaign", str(SCRIPT))
    spec = importlib.util.spec_from_loader("fuzz_campaign", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


fc = load_campaign()


def fake_fuzzer(tmp_path, body):
    """An executable that replays its first argument the way `body` (sh) says."""
    exe = tmp_path / "fake_fuzzer"
    exe.write_text("#!/bin/sh\n" + body + "\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe


def test_label_is_the_oracle_line_when_there_is_one():
    stderr = ("==kvguard-fuzz== ORACLE freed-while-readable: page 3\n"
              "==1==ERROR: AddressSanitizer: heap-use-after-free on address 0x1\n")
    assert fc.crash_label(stderr) == "freed-while-readable"


def test_label_falls_back_to_the_sanitizer_then_libfuzzer():
    assert (fc.crash_label("==7==ERROR: AddressSanitizer: heap-buffer-overflow on address")
            == "AddressSanitizer: heap-buffer-overflow")
    assert fc.crash_label("==7== ERROR: libFuzzer: deadly signal\n") == "deadly signal"
    assert fc.crash_label("nothing useful\n") == "no oracle line"


def test_each_crash_is_labelled_by_its_own_replay(tmp_path):
    # The fake target trips the oracle named in the input file: two crashes of one campaign
    # that tripped different oracles get different labels.
    exe = fake_fuzzer(tmp_path, 'echo "==kvguard-fuzz== ORACLE $(cat "$1"): why" >&2; exit 1')
    a, b = tmp_path / "crash-a", tmp_path / "crash-b"
    a.write_text("grant-while-readable")
    b.write_text("release-outcome")
    assert fc.crash_oracle(exe, "page_ops", str(a)) == "grant-while-readable"
    assert fc.crash_oracle(exe, "page_ops", str(b)) == "release-outcome"


def test_a_crash_that_replays_clean_says_so(tmp_path):
    exe = fake_fuzzer(tmp_path, "exit 0")
    crash = tmp_path / "crash-c"
    crash.write_text("x")
    assert fc.crash_oracle(exe, "page_ops", str(crash)) == "does not reproduce"


def make_files(folder, sizes):
    folder.mkdir(parents=True, exist_ok=True)
    for name, size in sizes.items():
        (folder / name).write_bytes(b"x" * size)


def test_update_seeds_keeps_at_most_max_seeds_the_largest(tmp_path):
    seeds, merged = tmp_path / "seeds", tmp_path / "merged"
    make_files(seeds, {f"old{i}": 1 for i in range(5)})
    make_files(merged, {"m1": 10, "m2": 30, "m3": 20, "old0": 1})
    fc.update_seeds(seeds, merged, 2)
    assert sorted(f.name for f in seeds.iterdir()) == ["m2", "m3"]


def test_update_seeds_keeps_the_whole_merge_when_it_fits(tmp_path):
    seeds, merged = tmp_path / "seeds", tmp_path / "merged"
    make_files(seeds, {"old0": 1, "old1": 1})
    make_files(merged, {"m1": 10, "old0": 1})
    fc.update_seeds(seeds, merged, 150)
    assert sorted(f.name for f in seeds.iterdir()) == ["m1", "old0"]


def run_cli(tmp_path, *args):
    return subprocess.run([sys.executable, str(SCRIPT), "--build-dir", str(tmp_path), *args],
                          capture_output=True, text=True,
                          env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1"))


@pytest.mark.parametrize("args, message", [
    (["run", "--max-seeds", "10"], "--max-seeds applies only with --update-seeds"),
    (["run", "--update-seeds", "--max-seeds", "0"], "--max-seeds must be at least 1"),
    (["run", "--seconds", "0"], "--seconds must be at least 1"),
    (["run", "--targets", "page_ops,nope"], "unknown name 'nope'"),
    (["planted", "--bugs", "nope"], "unknown name 'nope'"),
    (["planted", "--seeds", "0"], "--seeds must be at least 1"),
])
def test_bad_arguments_are_refused(tmp_path, args, message):
    p = run_cli(tmp_path, *args)
    assert p.returncode != 0 and message in p.stderr, p.stderr


def test_good_arguments_get_as_far_as_the_missing_build(tmp_path):
    # Accepted: the run stops only at the first fuzzer binary, which this empty build lacks.
    p = run_cli(tmp_path, "run", "--targets", "page_ops", "--update-seeds", "--max-seeds", "5",
                "--seconds", "1", "--out", str(tmp_path / "out"))
    assert p.returncode != 0 and "page_ops_fuzzer is missing" in p.stderr, p.stderr
