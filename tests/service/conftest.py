"""End-to-end harness: starts the real `kvguard serve` (or `kvguard-testserver`) on free
loopback ports with a tenants file written here, and talks to it with the official OpenAI
client and plain HTTP.

The binaries come from $KVGUARD_BIN and $KVGUARD_TESTSERVER (ctest sets both; see
tests/service/CMakeLists.txt), else from build/default/tools/.
"""

import hashlib
import json
import os
import pathlib
import re
import signal
import subprocess
import threading
import time

import httpx
import openai
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
KVGUARD = os.environ.get("KVGUARD_BIN", str(ROOT / "build/default/tools/kvguard"))
TESTSERVER = os.environ.get("KVGUARD_TESTSERVER",
                            str(ROOT / "build/default/tools/kvguard-testserver"))
MODEL = "tiny"
ADMIN_KEY = "test-admin-key"
# Four tenants, one strict; each key is only ever sent, its digest only ever stored.
TENANTS = {
    "acme": {"key": "key-acme", "mode": "enforce"},
    "beta": {"key": "key-beta", "mode": "strict"},
    "gamma": {"key": "key-gamma", "mode": "enforce"},
    "delta": {"key": "key-delta", "mode": "off"},
}


def digest(key):
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()


def write_tenants(path, limits=None, tenants=TENANTS):
    doc = {"tenants": []}
    for name, t in tenants.items():
        entry = {"name": name, "mode": t["mode"], "api_keys": [digest(t["key"])]}
        entry["limits"] = dict(limits or {"concurrent_requests": 64, "tokens_per_request": 480})
        doc["tenants"].append(entry)
    write_private(path, json.dumps(doc, indent=1))


def write_private(path, text):
    """Writes a file the server accepts as its tenants or admin key file: owned by this user,
    mode 0600 (the server refuses group or other access, as it does for its key files)."""
    path.write_text(text)
    os.chmod(path, 0o600)


class Server:
    """One running server process, its ports, its log and its audit log."""

    def __init__(self, tmp, binary=KVGUARD, extra=(), limits=None, model=MODEL):
        self.tmp = pathlib.Path(tmp)
        self.tenants_file = self.tmp / "tenants.json"
        write_tenants(self.tenants_file, limits)
        write_private(self.tmp / "admin.key", digest(ADMIN_KEY) + "\n")
        self.audit_dir = self.tmp / "audit"
        self.stderr_path = self.tmp / "server.stderr"
        self.model = model
        args = [binary, "serve", "--model", model, "--kv-cache-bytes", "16M",
                "--tenants", str(self.tenants_file), "--admin-key-file", str(self.tmp / "admin.key"),
                "--port", "0", "--admin-port", "0", "--audit-log", str(self.audit_dir),
                "--audit-signing-key", str(self.tmp / "audit.key"), "--max-body-bytes", "64K",
                "--read-timeout-ms", "2000", "--write-timeout-ms", "2000", *extra]
        if binary == TESTSERVER:
            args.remove("serve")
        self.stderr = open(self.stderr_path, "w")
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=self.stderr, text=True)
        deadline = time.time() + 60
        self.port = self.admin_port = None
        while time.time() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            m = re.search(r"listening on http://[\d.]+:(\d+), admin on http://[\d.]+:(\d+)", line)
            if m:
                self.port, self.admin_port = int(m.group(1)), int(m.group(2))
                break
        if self.port is None:
            self.stop()
            raise RuntimeError("server did not start:\n" + self.stderr_path.read_text())
        # Drain stdout so the server never blocks on a full pipe.
        threading.Thread(target=self.proc.stdout.read, daemon=True).start()
        self.base = f"http://127.0.0.1:{self.port}"
        self.admin = f"http://127.0.0.1:{self.admin_port}"

    def client(self, tenant, **kw):
        kw.setdefault("max_retries", 0)
        kw.setdefault("timeout", 60)
        return openai.OpenAI(base_url=self.base + "/v1", api_key=TENANTS[tenant]["key"], **kw)

    def admin_call(self, method, path, **kw):
        headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
        return httpx.request(method, self.admin + path, headers=headers, timeout=30, **kw)

    def pace(self, **units):
        """Paces the engine's workers (kvguard-testserver only: POST /admin/test/pace), e.g.
        pace(decode=0) to hold every request after its prefill, pace(decode=None) to let go."""
        r = self.admin_call("POST", "/admin/test/pace", json=units)
        assert r.status_code == 200, r.text

    def wait_running(self, n, timeout=60):
        """Waits until n requests are in the engine's decode batch (admitted and prefilled)."""
        deadline = time.time() + timeout
        while (running := self.metrics()["kvguard_requests_running"]) != n:
            assert time.time() < deadline, f"{running} requests running, waited for {n}"
            time.sleep(0.01)

    def metrics(self):
        text = httpx.get(self.admin + "/metrics", timeout=10).text
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                out[name] = float(value)
        return out

    def wait_idle(self, timeout=30):
        """Waits until no KV page is used and nothing runs or waits (all requests released)."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            m = self.metrics()
            used = [v for k, v in m.items() if k.startswith('kvguard_kv_pages{state="used"')]
            if used == [0] and m["kvguard_requests_running"] == 0 and \
                    m["kvguard_requests_queued"] == 0:
                return m
            time.sleep(0.1)
        raise AssertionError(f"server not idle: {self.metrics()}")

    def request_tenants(self):
        """Maps engine request id -> tenant, from the server's request log."""
        out = {}
        for line in self.stderr_path.read_text().splitlines():
            m = re.match(r"kvguard serve: request=(\d+) tenant=(\S+) ", line)
            if m and m.group(1) != "0":
                out[int(m.group(1))] = m.group(2)
        return out

    def request_timings(self):
        """Maps engine request id -> (queue_seconds, first_token_seconds), as the engine measured
        them, from the server's request log (requests that produced a token)."""
        out = {}
        for line in self.stderr_path.read_text().splitlines():
            m = re.match(r"kvguard serve: request=(\d+) .* queue_seconds=(\S+) "
                         r"first_token_seconds=(\S+)", line)
            if m:
                out[int(m.group(1))] = (float(m.group(2)), float(m.group(3)))
        return out

    def audit_records(self, *filters):
        out = subprocess.run([KVGUARD, "audit", "query", str(self.audit_dir), "--json", *filters],
                             capture_output=True, text=True, check=True).stdout
        return [json.loads(line) for line in out.splitlines() if line.strip()]

    def alive(self):
        return self.proc.poll() is None

    def stop(self, sig=signal.SIGTERM, timeout=60):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.stderr.close()
        return self.proc.returncode


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = Server(tmp_path_factory.mktemp("serve"))
    yield s
    assert s.stop() == 0, s.stderr_path.read_text()
