"""Graceful shutdown on SIGTERM: new requests are refused, requests in flight finish within the
deadline (or are cancelled at it, with an error on their own connection), the audit log is
flushed and closed (service_stop, then a final checkpoint) and verifies."""

import signal
import subprocess
import threading
import time

import httpx
import openai

from conftest import KVGUARD, TENANTS, TESTSERVER, Server


class Stream(threading.Thread):
    """One streaming completion, held mid-way by the test's pacing of the engine (hold)."""

    def __init__(self, server, tenant, max_tokens):
        super().__init__(daemon=True)
        self.server, self.tenant, self.max_tokens = server, tenant, max_tokens
        self.started = threading.Event()
        self.finish_reason = self.error = None
        self.chunks = 0

    def run(self):
        try:
            for ch in self.server.client(self.tenant).completions.create(
                    model=self.server.model, prompt="A long story", max_tokens=self.max_tokens,
                    stream=True, extra_body={"ignore_eos": True}):
                self.chunks += 1
                self.started.set()
                if ch.choices and ch.choices[0].finish_reason:
                    self.finish_reason = ch.choices[0].finish_reason
        except openai.APIError as e:
            self.error = e
        finally:
            self.started.set()


def wait_for(predicate, what, timeout=60):
    """Polls an observable state of the server until it holds (the timeout only bounds a
    failing run)."""
    deadline = time.time() + timeout
    while not predicate():
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def hold(server, streams):
    """Starts the streams and holds them mid-way, whatever the machine's speed: with decoding
    paused they are all admitted, then 20 decode steps give each of them its first chunks (of
    far more tokens than 20), then decoding stays paused until the test resumes it."""
    server.pace(decode=0)
    for st in streams:
        st.start()
    server.wait_running(len(streams))
    server.pace(decode=20)
    for st in streams:
        assert st.started.wait(60)


def draining(server):
    r = httpx.get(server.base + "/readyz", timeout=10)
    if r.status_code != 503:
        assert r.json() == {"ready": True}
        return False
    assert r.json() == {"ready": False}  # not ready, and nothing internal on the public port
    return True


def verify_audit_log(server):
    pub = server.tmp / "pub.pem"
    subprocess.run([KVGUARD, "audit", "pubkey", "--signing-key", str(server.tmp / "audit.key"),
                    "--out", str(pub)], check=True, capture_output=True)
    out = subprocess.run([KVGUARD, "audit", "verify", str(server.audit_dir), "--pubkey", str(pub)],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert server.audit_records("--type", "service_stop")


def test_sigterm_lets_in_flight_requests_finish(tmp_path):
    s = Server(tmp_path, binary=TESTSERVER, extra=["--shutdown-deadline-ms", "600000"])
    streams = [Stream(s, t, 200) for t in ("acme", "beta")]
    hold(s, streams)
    s.proc.send_signal(signal.SIGTERM)
    wait_for(lambda: draining(s), "the server to start draining")
    # Held, the streams are still running; a new request is refused (503) meanwhile.
    assert all(st.is_alive() for st in streams), [(st.chunks, st.finish_reason, st.error)
                                                  for st in streams]
    r = httpx.post(s.base + "/v1/completions", timeout=10, json={"model": s.model, "prompt": "x"},
                   headers={"Authorization": f"Bearer {TENANTS['gamma']['key']}"})
    assert r.status_code == 503 and r.json()["error"]["code"] == "shutting_down"
    s.pace(decode=None)  # the admin API stays up while the server drains
    for st in streams:
        st.join(600)
        assert st.error is None, st.error
        assert st.finish_reason == "length"
    assert s.proc.wait(60) == 0
    s.stop()
    assert "stopped" in s.stderr_path.read_text()
    verify_audit_log(s)


def test_sigterm_cancels_at_the_deadline(tmp_path):
    s = Server(tmp_path, binary=TESTSERVER, extra=["--shutdown-deadline-ms", "300"])
    st = Stream(s, "acme", 400)
    hold(s, [st])  # still held at the deadline: the server must cancel it
    start = time.time()
    s.proc.send_signal(signal.SIGTERM)
    st.join(60)
    assert st.error is not None and st.error.body["code"] == "request_cancelled", st.error
    assert s.proc.wait(60) == 0
    assert time.time() - start < 10
    s.stop()
    verify_audit_log(s)
