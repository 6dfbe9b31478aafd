#!/usr/bin/env python3
"""bench/serve_load.py: the bounded load test of `kvguard serve`.

Starts the real server (tests/service/conftest.py's harness: free loopback ports, four
tenants, an audit log), then runs CLIENTS closed-loop clients spread evenly over the tenants
for DURATION seconds with the official OpenAI client (async): each sends a request, waits for
the whole response, checks it, and sends the next; requests alternate between plain and
streamed. Every request must come back complete (finish_reason "length", completion_tokens ==
max_tokens, ignore_eos so the length is known) and be attributed, in the server's own request
log, to the tenant whose key sent it. Reports throughput and latency percentiles; writes
OUT.json and OUT.md; exits 1 if any response was lost or went to the wrong tenant.

Head-of-line blocking: --long-clients N makes the first N clients send prompts of about
--long-prompt-tokens tokens (a phrase repeated, sized once against the server's own token
count) beside the others' short ones; time to first token is then reported for the short
and the long requests apart.

Another engine: --url URL drives an OpenAI-compatible server that is already running (e.g.
llama.cpp's `llama-server`) with the same clients and the same checks of each response; it has
no tenants, so every client sends --api-key and the per-tenant attribution checks (and the
engine's own timings) are left out. --model PATH.gguf serves a GGUF file with kvguard instead of
a built-in model (bench/make_gguf.py makes one both engines can load).

  .venv/bin/python bench/serve_load.py --kvguard build/default/tools/kvguard \
      --clients 64 --duration 60 --out bench/results/serve-load
  .venv/bin/python bench/serve_load.py --url http://127.0.0.1:8090 --label "llama-server Q4_0" \
      --clients 64 --duration 60
"""

import argparse
import asyncio
import datetime
import json
import os
import pathlib
import platform
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests/service"))

import httpx  # noqa: E402
import openai  # noqa: E402

import conftest  # noqa: E402  (the e2e harness: Server, TENANTS)


def percentile(values, p):
    if not values:
        return float("nan")
    s = sorted(values)
    k = (len(s) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


class Target:
    """Where the clients send their requests: kvguard's test harness server (one key per
    tenant), or an external OpenAI-compatible server (one key for all)."""

    def __init__(self, base, model, server=None, api_key=None):
        self.base, self.model, self.server, self.api_key = base, model, server, api_key

    def key(self, tenant):
        return self.api_key if self.server is None else conftest.TENANTS[tenant]["key"]


def served_model(base, key):
    """The first model id the server lists (kvguard: the built-in name or the GGUF's stem)."""
    r = httpx.get(base + "/v1/models", headers={"Authorization": f"Bearer {key}"}, timeout=30)
    r.raise_for_status()
    return r.json()["data"][0]["id"]


async def client_loop(target, i, tenant, deadline, max_tokens, results, prefix=""):
    c = openai.AsyncOpenAI(base_url=target.base + "/v1", api_key=target.key(tenant),
                           max_retries=0, timeout=300)
    n = 0
    while time.monotonic() < deadline:
        stream = n % 2 == 1
        kw = dict(model=target.model, prompt=f"{prefix}client {i} request {n}: tell me a story",
                  max_tokens=max_tokens, temperature=0.7, seed=i * 100003 + n,
                  extra_body={"ignore_eos": True})
        rec = {"tenant": tenant, "client": i, "stream": stream, "long": bool(prefix)}
        t0 = time.monotonic()
        try:
            if stream:
                first = None
                chunks = []
                async for ch in await c.completions.create(
                        stream=True, stream_options={"include_usage": True}, **kw):
                    if first is None:
                        first = time.monotonic() - t0
                    chunks.append(ch)
                finish = next((ch.choices[0].finish_reason for ch in chunks
                               if ch.choices and ch.choices[0].finish_reason), None)
                usage = chunks[-1].usage if chunks else None
                rec.update(id=chunks[0].id, ttft=first, finish=finish,
                           tokens=usage.completion_tokens if usage else None)
            else:
                r = await c.completions.create(**kw)
                rec.update(id=r.id, finish=r.choices[0].finish_reason,
                           tokens=r.usage.completion_tokens)
            rec["latency"] = time.monotonic() - t0
            rec["ok"] = rec["finish"] == "length" and rec["tokens"] == max_tokens
        except Exception as e:  # a lost response: recorded, never hidden
            rec.update(latency=time.monotonic() - t0, ok=False,
                       error=(repr(e) + " <- " + repr(e.__cause__))[:300])
        results.append(rec)
        n += 1
    await c.close()


PROBE_TENANT = "acme"  # sizes the long prompt: one request the clients do not count


async def long_prefix(target, tokens):
    """A repeated phrase of about `tokens` prompt tokens, by the server's own count."""
    if tokens <= 0:
        return ""
    c = openai.AsyncOpenAI(base_url=target.base + "/v1", api_key=target.key(PROBE_TENANT),
                           max_retries=0, timeout=300)
    phrase = "once upon a time in a land far away "
    probe = await c.completions.create(model=target.model, prompt=phrase * 20, max_tokens=1)
    per = probe.usage.prompt_tokens / 20
    await c.close()
    return phrase * max(1, int((tokens - 16) / per))


async def run_clients(target, clients, tenants, duration, max_tokens, long_clients, long_tokens):
    results = []
    prefix = await long_prefix(target, long_tokens if long_clients else 0)
    deadline = time.monotonic() + duration
    start = time.monotonic()
    await asyncio.gather(*[client_loop(target, i, tenants[i % len(tenants)], deadline, max_tokens,
                                       results, prefix if i < long_clients else "")
                           for i in range(clients)])
    return results, time.monotonic() - start


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kvguard", default=conftest.KVGUARD)
    ap.add_argument("--model", default="small")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--duration", type=float, default=60)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--kv-cache-bytes", default="256M")
    ap.add_argument("--long-clients", type=int, default=0,
                    help="this many clients send long prompts (head-of-line blocking)")
    ap.add_argument("--long-prompt-tokens", type=int, default=2000)
    ap.add_argument("--engine-flags", default="",
                    help="more flags for `kvguard serve`, e.g. \"--step-tokens 256\"")
    ap.add_argument("--out", default=None, help="write OUT.json and OUT.md")
    ap.add_argument("--url", default=None,
                    help="drive this running OpenAI-compatible server instead of starting kvguard")
    ap.add_argument("--api-key", default="none", help="with --url: the key every client sends")
    ap.add_argument("--label", default=None, help="with --url: what the server is (the report)")
    args = ap.parse_args()
    tenants = list(conftest.TENANTS)  # four: enforce, strict, enforce, off

    load_before = os.getloadavg()[0]
    if args.url:
        target = Target(args.url.rstrip("/"), served_model(args.url.rstrip("/"), args.api_key),
                        api_key=args.api_key)
        results, wall = asyncio.run(run_clients(target, args.clients, tenants, args.duration,
                                                args.max_tokens, args.long_clients,
                                                args.long_prompt_tokens))
        metrics, log, timings, rc = {}, None, {}, 0
    else:
        with tempfile.TemporaryDirectory() as tmp:
            server = conftest.Server(tmp, binary=args.kvguard, model=args.model,
                                     limits={"concurrent_requests": args.clients,
                                             "tokens_per_request": max(args.max_tokens, 16)},
                                     extra=["--kv-cache-bytes", args.kv_cache_bytes,
                                            "--read-timeout-ms", "60000",
                                            "--write-timeout-ms", "60000",
                                            *args.engine_flags.split()])
            try:
                target = Target(server.base, served_model(server.base,
                                                          conftest.TENANTS[tenants[0]]["key"]),
                                server=server)
                results, wall = asyncio.run(run_clients(target, args.clients, tenants,
                                                        args.duration, args.max_tokens,
                                                        args.long_clients,
                                                        args.long_prompt_tokens))
                metrics = server.metrics()
                log = server.request_tenants()
                timings = server.request_timings()
            finally:
                rc = server.stop()
    ok = [r for r in results if r["ok"]]
    lost = [r for r in results if not r["ok"]]
    per_tenant = {t: sum(1 for r in ok if r["tenant"] == t) for t in tenants}
    if log is None:  # another engine: no tenants to attribute, no request log
        wrong, served = [], None
    else:
        wrong = [r for r in ok if log.get(int(r["id"].split("-")[1])) != r["tenant"]]
        # The server's own count of answered requests per tenant must match the clients'.
        served = {t: int(sum(v for k, v in metrics.items()
                             if k.startswith("kvguard_requests_total{") and f'tenant="{t}"' in k
                             and 'route="/v1/completions"' in k and 'code="200"' in k))
                  for t in tenants}
    lat = [r["latency"] for r in ok]
    summary = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:]),
        "server": args.label or args.url if args.url else "kvguard",
        "build": (args.label or args.url) if args.url else subprocess.run(
            [args.kvguard, "version"], capture_output=True, text=True).stdout.strip(),
        "host": {"cpus": os.cpu_count(), "machine": platform.machine(),
                 "nice": os.nice(0), "loadavg_1m_before": load_before,
                 "loadavg_1m_after": os.getloadavg()[0]},
        "model": target.model, "clients": args.clients, "tenants": tenants,
        "duration_s": args.duration, "wall_s": round(wall, 2), "max_tokens": args.max_tokens,
        "requests": len(results), "completed": len(ok), "lost": len(lost),
        "wrong_tenant": len(wrong), "completed_per_tenant": per_tenant,
        "server_200_per_tenant": served, "server_exit_code": rc,
        "requests_per_s": round(len(ok) / wall, 2),
        "output_tokens_per_s": round(len(ok) * args.max_tokens / wall, 1),
        "latency_s": {"p50": round(percentile(lat, 50), 4), "p99": round(percentile(lat, 99), 4),
                      "max": round(max(lat), 4) if lat else None},
        "latency_plain_s": {p: round(percentile([r["latency"] for r in ok if not r["stream"]],
                                                int(p[1:])), 4) for p in ("p50", "p99")},
        "latency_stream_s": {p: round(percentile([r["latency"] for r in ok if r["stream"]],
                                                 int(p[1:])), 4) for p in ("p50", "p99")},
        "ttft_stream_s": {p: round(percentile([r["ttft"] for r in ok if r["stream"]],
                                              int(p[1:])), 4) for p in ("p50", "p99")},
        # The engine's own view (request log): submit -> admission, submit -> first token.
        "server_queue_s": {p: round(percentile([timings[i][0] for i in ids(ok) if i in timings],
                                                int(p[1:])), 4) for p in ("p50", "p99")},
        "server_ttft_s": {p: round(percentile([timings[i][1] for i in ids(ok) if i in timings],
                                               int(p[1:])), 4) for p in ("p50", "p99")},
        "server_ttft_short_s": {p: round(percentile(
            [timings[i][1] for i in ids([r for r in ok if not r["long"]]) if i in timings],
            int(p[1:])), 4) for p in ("p50", "p99")},
        # The five short requests the engine took longest to answer: (queue s, first token s).
        "slowest_short_server": sorted(
            (timings[i] for i in ids([r for r in ok if not r["long"]]) if i in timings),
            key=lambda t: -t[1])[:5],
        "long_clients": args.long_clients,
        "long_prompt_tokens": args.long_prompt_tokens if args.long_clients else None,
        "ttft_stream_short_s": {p: round(percentile(
            [r["ttft"] for r in ok if r["stream"] and not r["long"]], int(p[1:])), 4)
            for p in ("p50", "p99")},
        "ttft_stream_long_s": {p: round(percentile(
            [r["ttft"] for r in ok if r["stream"] and r["long"]], int(p[1:])), 4)
            for p in ("p50", "p99")},
        "completed_long": sum(1 for r in ok if r["long"]),
        "server_metrics": {k: metrics.get(k) for k in ("kvguard_verify_seconds_per_step",
                                                        "kvguard_preemptions_total",
                                                        "kvguard_audit_log_healthy")},
        "lost_examples": lost[:5],
    }
    failed = (len(lost) > 0 or len(wrong) > 0 or not ok or rc != 0
              or (served is not None and
                  any(per_tenant[t] + (t == PROBE_TENANT and args.long_clients > 0) != served[t]
                      for t in tenants)))
    summary["pass"] = not failed
    text = json.dumps(summary, indent=1)
    print(text)
    if args.out:
        pathlib.Path(args.out + ".json").write_text(text + "\n")
        pathlib.Path(args.out + ".md").write_text(markdown(summary))
    return 1 if failed else 0


def ids(records):
    """kvguard's request ids ("cmpl-N") as numbers; another engine's ids give none."""
    parts = (r["id"].split("-") for r in records)
    return [int(p[1]) for p in parts if len(p) == 2 and p[1].isdigit()]


def hol(s):
    if not s.get("long_clients"):
        return ""
    sh, lg = s["ttft_stream_short_s"], s["ttft_stream_long_s"]
    return (f"Head-of-line: {s['long_clients']} of the clients sent prompts of about "
            f"{s['long_prompt_tokens']} tokens ({s['completed_long']} completed). Time to first "
            f"token of the short streamed requests p50 {sh['p50']} s, p99 {sh['p99']} s; of the "
            f"long ones p50 {lg['p50']} s, p99 {lg['p99']} s.\n\n")


def engine_clock(s):
    if s["server_200_per_tenant"] is None:
        return ""
    q, t = s["server_queue_s"], s["server_ttft_s"]
    return (f" The engine's own\nclock (request log, every request): queue p50 {q['p50']} s, p99 "
            f"{q['p99']} s; time to first token\np50 {t['p50']} s, p99 {t['p99']} s.")


def who(s):
    if s["server_200_per_tenant"] is None:
        return "with one key (the server has no tenants)"
    return (f"over {len(s['tenants'])}\ntenants ({', '.join(s['tenants'])}: enforce, strict, "
            f"enforce, off)")


def attribution(s):
    if s["server_200_per_tenant"] is None:
        return (f"Another engine: no tenants to attribute, no request log; exit code "
                f"{s['server_exit_code']}.")
    return f"""Completed per tenant (clients) {s['completed_per_tenant']}; answered with 200 per tenant
(server's /metrics) {s['server_200_per_tenant']}. A response counts as delivered to the right
tenant when the server's request log attributes its id to the tenant whose key sent it.
Server: {s['server_metrics']}; exit code {s['server_exit_code']}."""


def markdown(s):
    lat, pl, st, tt = s["latency_s"], s["latency_plain_s"], s["latency_stream_s"], s["ttft_stream_s"]
    title = "`kvguard serve`" if s["server"] == "kvguard" else s["server"]
    return f"""# {title} under load

`{s['command']}` ({s['date']})

{s['clients']} closed-loop clients (the official OpenAI client, async) {who(s)} for {s['duration_s']} s
against {s['server']} on loopback; model `{s['model']}`, {s['max_tokens']} output tokens per
request (ignore_eos), requests alternating plain / streamed. Host: {s['host']['cpus']} CPUs,
nice {s['host']['nice']}, 1-minute load average {s['host']['loadavg_1m_before']:.2f} before the
run and {s['host']['loadavg_1m_after']:.2f} after it; clients and server share the machine.

| requests | completed | lost | wrong tenant | requests/s | output tokens/s | p50 s | p99 s | max s |
| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |
| {s['requests']} | {s['completed']} | {s['lost']} | {s['wrong_tenant']} | {s['requests_per_s']} | {s['output_tokens_per_s']} | {lat['p50']} | {lat['p99']} | {lat['max']} |

Plain requests: p50 {pl['p50']} s, p99 {pl['p99']} s. Streamed: p50 {st['p50']} s, p99
{st['p99']} s, time to first token p50 {tt['p50']} s, p99 {tt['p99']} s.{engine_clock(s)}

{hol(s)}{attribution(s)}

Build:

```
{s['build']}
```
"""


if __name__ == "__main__":
    sys.exit(main())
