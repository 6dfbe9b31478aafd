"""Bad input: each gets a 4xx with an OpenAI error body (or, for a vanished client, nothing),
its KV pages are released and counted, and the server goes on serving."""

import socket
import time

import httpx
import pytest

from conftest import MODEL, TENANTS

AUTH = {"Authorization": f"Bearer {TENANTS['acme']['key']}"}


def post(server, body, path="/v1/completions", headers=AUTH, **kw):
    return httpx.post(server.base + path, content=body, timeout=30,
                      headers={**headers, "Content-Type": "application/json"}, **kw)


CASES = [
    # (name, path, body, status, code)
    ("malformed json", "/v1/completions", b'{"model": "tiny", "prompt": ', 400, "invalid_value"),
    ("not an object", "/v1/completions", b"[]", 400, "invalid_value"),
    ("empty body", "/v1/completions", b"", 400, "invalid_value"),
    ("invalid utf-8", "/v1/completions", b'{"model": "tiny", "prompt": "\xff\xfe"}', 400,
     "invalid_value"),
    ("prompt wrong type", "/v1/completions", b'{"model": "tiny", "prompt": {"a": 1}}', 400,
     "invalid_type"),
    ("max_tokens wrong type", "/v1/completions",
     b'{"model": "tiny", "prompt": "x", "max_tokens": "many"}', 400, "invalid_type"),
    ("missing prompt", "/v1/completions", b'{"model": "tiny"}', 400, "invalid_value"),
    ("missing model", "/v1/completions", b'{"prompt": "x"}', 400, "invalid_value"),
    ("missing messages", "/v1/chat/completions", b'{"model": "tiny"}', 400, "invalid_value"),
    ("max_tokens zero", "/v1/completions", b'{"model": "tiny", "prompt": "x", "max_tokens": 0}',
     400, "invalid_value"),
    ("max_tokens negative", "/v1/completions",
     b'{"model": "tiny", "prompt": "x", "max_tokens": -1}', 400, "invalid_value"),
    ("max_tokens absurd", "/v1/completions",
     b'{"model": "tiny", "prompt": "x", "max_tokens": 1000000000000}', 400, "invalid_value"),
    ("unknown model", "/v1/completions", b'{"model": "gpt-9", "prompt": "x"}', 404,
     "model_not_found"),
    ("temperature out of range", "/v1/completions",
     b'{"model": "tiny", "prompt": "x", "temperature": -1}', 400, "invalid_value"),
    ("prompt beyond the context", "/v1/completions",
     b'{"model": "tiny", "prompt": "' + b"x" * 600 + b'", "max_tokens": 4}', 400,
     "context_length_exceeded"),
]


@pytest.mark.parametrize("name,path,body,status,code", CASES, ids=[c[0] for c in CASES])
def test_bad_request(server, name, path, body, status, code):
    r = post(server, body, path)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] == code
    assert set(err) >= {"message", "type", "param", "code"}
    assert err["message"]


def test_body_over_the_limit(server):
    body = b'{"model": "tiny", "prompt": "' + b"x" * (70 * 1024) + b'"}'
    r = post(server, body)
    assert r.status_code == 413
    assert r.json()["error"]["code"] == "request_too_large"


def test_unknown_route_and_method(server):
    r = httpx.get(server.base + "/v1/nothing", headers=AUTH)
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "not_found"


def test_slow_client_is_dropped_and_others_are_served(server):
    """A client that sends half a request and stalls is disconnected after the read timeout
    (2 s here); meanwhile and afterwards, others are served."""
    s = socket.create_connection(("127.0.0.1", server.port))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"mo")
    r = server.client("beta").completions.create(model=MODEL, prompt="x", max_tokens=2)
    assert r.usage.completion_tokens == 2
    s.settimeout(10)
    start = time.time()
    data = b""
    try:
        while chunk := s.recv(4096):
            data += chunk
    except ConnectionResetError:
        pass
    assert time.time() - start < 9, "the slow client was never dropped"
    s.close()
    assert b" 200 " not in data
    assert server.alive()


def test_client_disconnect_mid_stream_releases_pages(server):
    """A streaming client that vanishes after its first chunk: the engine request is cancelled,
    its pages go back to the pool, and the disconnect is counted."""
    key = 'kvguard_request_outcomes_total{outcome="client_disconnected"}'
    before = server.metrics().get(key, 0)
    s = socket.create_connection(("127.0.0.1", server.port))
    # 480 tokens past any EOS: far longer than reading one chunk and resetting takes.
    body = (b'{"model": "tiny", "prompt": "Tell me everything", "max_tokens": 480, '
            b'"ignore_eos": true, "stream": true}')
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Authorization: Bearer " + TENANTS["gamma"]["key"].encode() +
              b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    data = b""
    while b"data: " not in data:
        data += s.recv(4096)
    # Reset (not a polite close): the server's next write fails at once.
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    s.close()
    server.wait_idle()
    # The count is taken when the connection's handler finishes, just after the pages return.
    deadline = time.time() + 10
    while server.metrics().get(key, 0) < before + 1 and time.time() < deadline:
        time.sleep(0.05)
    assert server.metrics().get(key, 0) == before + 1, server.stderr_path.read_text()[-2000:]
    assert server.alive()


def test_everything_released_after_bad_input(server):
    m = server.wait_idle()
    assert m['kvguard_kv_pages{state="free",dtype="fp8_e4m3"}'] > 0
    r = server.client("acme").completions.create(model=MODEL, prompt="still here", max_tokens=3)
    assert r.usage.completion_tokens == 3


def raw_request(server, header_lines):
    """Sends GET /v1/models with `header_lines` extra header lines on its own connection and
    returns (status, body)."""
    head = (b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            b"Authorization: Bearer " + TENANTS["acme"]["key"].encode() + b"\r\n" +
            b"".join(line + b"\r\n" for line in header_lines) + b"\r\n")
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as s:
        s.sendall(head)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    status = int(data.split(b" ", 2)[1])
    return status, data.split(b"\r\n\r\n", 1)[1]


def test_twenty_thousand_header_lines_get_431(server):
    lines = [b"X-Filler-%d: %d" % (i, i) for i in range(20000)]
    status, body = raw_request(server, lines)
    assert status == 431, body[:200]
    err = httpx.Response(431, content=body).json()["error"]
    assert err["code"] == "request_header_fields_too_large"
    assert "header lines" in err["message"] and "X-Filler" not in err["message"]
    assert server.alive()


def test_thirty_headers_are_served(server):
    """The twin: a request with 30 extra headers is an ordinary one."""
    status, body = raw_request(server, [b"X-Extra-%d: value %d" % (i, i) for i in range(30)])
    assert status == 200, body[:200]
    r = httpx.get(server.base + "/v1/models", timeout=30,
                  headers={**AUTH, **{f"X-Extra-{i}": "v" for i in range(30)}})
    assert r.status_code == 200, r.text


def test_one_hundred_header_lines_are_served_one_more_gets_431(server):
    """At the documented limit (100 lines, the request line aside): raw_request sends Host,
    Connection and Authorization, so 97 more make 100. The server's own bookkeeping entries
    (cpp-httplib adds the peer's address and port) do not count."""
    status, body = raw_request(server, [b"X-Line-%d: v" % i for i in range(97)])
    assert status == 200, body[:200]
    status, body = raw_request(server, [b"X-Line-%d: v" % i for i in range(98)])
    assert status == 431, body[:200]
    assert b"101 header lines; the limit is 100" in body


def test_header_bytes_over_the_limit_get_431(server):
    # 12 lines of 4 KiB: each line within httplib's own line limit, 48 KiB in all (limit 32 KiB).
    big = [b"X-Big-%d: " % i + b"v" * 4096 for i in range(12)]
    status, body = raw_request(server, big)
    assert status == 431, body[:200]
    assert b"bytes of headers" in body
    # Twin: 6 such lines (24 KiB) are served.
    status, body = raw_request(server, big[:6])
    assert status == 200, body[:200]


def test_public_readyz_says_ready_and_nothing_else(server):
    r = httpx.get(server.base + "/readyz", timeout=10)
    assert r.status_code == 200
    assert r.json() == {"ready": True}
    # The admin listener (loopback here: no key needed) has the detail.
    detail = httpx.get(server.admin + "/readyz", timeout=10).json()
    assert detail["ready"] is True and detail["audit_log"] == "ok"
