"""An isolation violation aborts exactly one request: the test build (kvguard-testserver, the
fault-injection variant) releases the first KV page of the next request of one tenant in the
middle of a decode step. That request gets a 500 with code kv_integrity_violation and its
request id, the audit log has its violation record under that id, and every other request,
of that tenant and of others, completes."""

import concurrent.futures
import pathlib
import time

import httpx
import openai
import pytest

from conftest import MODEL, TESTSERVER, Server


@pytest.fixture(scope="module")
def testserver(tmp_path_factory):
    if not pathlib.Path(TESTSERVER).exists():
        pytest.fail(f"{TESTSERVER} is not built")
    s = Server(tmp_path_factory.mktemp("fault"), binary=TESTSERVER)
    yield s
    assert s.stop() == 0, s.stderr_path.read_text()


def run(server, tenant, prompt, stream):
    c = server.client(tenant)
    kw = dict(model=MODEL, prompt=prompt, max_tokens=48, extra_body={"ignore_eos": True})
    try:
        if stream:
            chunks = list(c.completions.create(stream=True, **kw))
            return tenant, "ok", chunks[-1].choices[0].finish_reason, None
        r = c.completions.create(**kw)
        return tenant, "ok", r.choices[0].finish_reason, None
    except openai.APIError as e:
        return tenant, "error", e, getattr(e, "body", None)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_violation_aborts_exactly_one_request(testserver, stream):
    s = testserver
    before = len(s.audit_records("--type", "violation"))
    assert s.admin_call("POST", "/admin/test/abort-next", json={"tenant": "acme"}).status_code == 200
    # The victim first, alone, so that it is "the next request of acme"; once the server has
    # taken it (and with it the fault), the crowd.
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        victim = pool.submit(run, s, "acme", "victim", stream)
        deadline = time.time() + 60
        while s.admin_call("GET", "/admin/tenants").json()["tenants"][0]["in_flight"] == 0 and \
                not victim.done():
            assert time.time() < deadline, "the victim never reached the server"
            time.sleep(0.002)
        others = [pool.submit(run, s, t, f"bystander {i}", stream)
                  for i, t in enumerate(["acme", "beta", "gamma", "delta"] * 2)]
        results = [victim.result()] + [f.result() for f in others]
    errors = [r for r in results if r[1] == "error"]
    assert len(errors) == 1, results
    tenant, _, exc, body = errors[0]
    assert tenant == "acme" and results[0][1] == "error"
    assert body["code"] == "kv_integrity_violation", body
    request_id = body["request_id"]
    assert str(request_id) in body["message"]
    if not stream:
        assert isinstance(exc, openai.InternalServerError)
    for r in results[1:]:
        assert r[1:3] == ("ok", "length"), r
    # The audit record names the same request, the tenant, and a reason.
    # Records of enforce tenants reach the disk in batches (within 100 ms): poll.
    deadline = time.time() + 10
    while not (records := s.audit_records("--type", "violation", "--request", str(request_id))) \
            and time.time() < deadline:
        time.sleep(0.05)
    assert records, s.audit_records("--type", "violation")
    assert all(r["tenant"] == "acme" for r in records)
    assert records[0]["reason"] in ("stale_generation", "kernel_tag_mismatch", "page_not_owned")
    assert len(s.audit_records("--type", "violation")) == before + len(records)
    m = s.wait_idle()
    assert sum(v for k, v in m.items() if k.startswith("kvguard_violations_total{")) >= 1
    assert s.alive()


def test_pace_takes_counts_or_null_and_refuses_anything_else(testserver):
    s = testserver
    for body in ([], {}, {"decode": -1}, {"decode": 1.5}, {"decode": "0"}, {"decode": True},
                 {"prefill": 0, "other": 1}, {"decode": 2 ** 63}):
        r = s.admin_call("POST", "/admin/test/pace", json=body)
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_value", (body, r.text)
    r = httpx.post(s.admin + "/admin/test/pace", json={"decode": None}, timeout=10)
    assert r.status_code == 401, r.text  # admin key required
    # Positive twin: a held request is let go and completes; nothing above changed the pacing.
    s.pace(decode=0)
    try:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            held = pool.submit(run, s, "acme", "held", False)
            s.wait_running(1)
            assert not held.done()
            s.pace(prefill=None, decode=None)
            assert held.result()[1:3] == ("ok", "length")
    finally:
        s.pace(prefill=None, decode=None)  # the module's other tests share this server
    s.wait_idle()
