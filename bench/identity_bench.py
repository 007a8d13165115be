"""Authentication cost (issue "identity", "Speed"): an issued key against platform tokens (JWT).

Phases:

- `in_process`: in this process, on the gate's configuration (10,000 people and keys, an issuer
  with an RS256, an ES256 and an EdDSA key; tests/bench/test_core_gates.py `token_core`), one call
  timed at a time, blocks alternating: `Core.authenticate` with the key, with a token seen before
  (the verdict cache), and `Core.verify_token(cached=False)` per algorithm (a first sight: the
  signature and the claims every time). Percentiles in microseconds.
- `proxy`: floor_bench's fast upstream (nginx, a fixed 1.7 KB OpenAI stream) and one gateway:
  `POST /v1/proxy` with the person's key and with their RS256 and ES256 tokens (from an issuer
  with an inline JWK Set), back to back on one connection, rounds alternating the targets, beside
  the direct call: the added p50/p99 of each, in one run.

    .venv/bin/python bench/identity_bench.py            # ~1 min
    .venv/bin/python bench/identity_bench.py --quick    # smoke check (~20 s)
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import secrets
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
# NOTE: after the root: tests/ has a package named bench too (the gates), reached as tests.bench.
if str(ROOT / "tests") not in sys.path:
    sys.path.append(str(ROOT / "tests"))

from bench import floor_bench as fb  # noqa: E402
from bench import harness, loadgen  # noqa: E402
from bench import proxy_bench as pb  # noqa: E402
from bench.harness import BenchError, Server  # noqa: E402

RESULTS_DIR = ROOT / "bench" / "results"
NOTE = ("Everything (nginx, the gateway with its embedded PostgreSQL, the load generator) shares this machine's "
        "CPUs unpinned. Added latency is a difference of percentiles (target pN - direct pN). In-process times are "
        "single calls timed with perf_counter_ns (its own cost, ~0.1 us, included).")


def _pcts(values: list[int]) -> dict[str, float]:
    ordered = sorted(values)

    def at(p: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(p * len(ordered)))] / 1000, 2)

    return {"p50": at(0.5), "p90": at(0.9), "p99": at(0.99), "mean": round(statistics.fmean(ordered) / 1000, 2)}


def phase_in_process(args) -> dict:
    import gc

    from tests.bench import test_core_gates as gates

    core, tokens, key = gates.make_token_core(Path(tempfile.mkdtemp(prefix="identity-seg-")))
    now = gates.TOKEN_NOW_MS
    calls = {
        "key": (core.authenticate, (f"Bearer {key}", None, None, None, now)),
        "token_cached": (core.authenticate, (f"Bearer {tokens['RS256']}", None, None, None, now)),
        **{f"token_first_sight_{alg}": (core.verify_token, (tokens[alg], now, False)) for alg in tokens},
    }
    times: dict[str, list[int]] = {name: [] for name in calls}
    clock = time.perf_counter_ns
    gc.disable()
    try:
        for _ in range(args.blocks):
            for name, (fn, fargs) in calls.items():
                block = args.block_calls if not name.startswith("token_first") else max(50, args.block_calls // 20)
                for _ in range(block):
                    t0 = clock()
                    fn(*fargs)
                    times[name].append(clock() - t0)
    finally:
        gc.enable()
    return {"people": 10_000, "calls": {n: len(v) for n, v in times.items()},
            "us": {n: _pcts(v) for n, v in times.items()}}


def _issuer_and_tokens(user_email: str) -> tuple[dict, dict[str, str]]:
    from jwtkit import Issuer, jwks, new_key

    iss = Issuer(f"https://idp-{secrets.token_hex(3)}.example.com")
    for alg in ("RS256", "ES256"):
        iss.keys[alg] = new_key(alg, f"bench-{alg}")
    now = int(time.time())
    body = {"issuer": iss.name, "audiences": [iss.audience], "algorithms": ["RS256", "ES256"],
            "jwks": jwks(*iss.keys.values()), "claims": {"email": "email"}}
    return body, {alg: iss.token(user_email, key, None, exp=now + 3600) for alg, key in iss.keys.items()}


def phase_proxy(args, work_dir: Path) -> dict:
    env = fb.server_env(argparse.Namespace(loop=None))
    port = harness.free_port()
    conf = work_dir / "nginx.conf"
    conf.write_text(fb.nginx_conf(work_dir, port, 1))
    upstream = harness.nginx_server(work_dir, conf, env)
    upstream_url = f"http://127.0.0.1:{port}"
    st = pb.Stack()
    st.meshfast_url = f"http://127.0.0.1:{harness.free_port()}"
    st.data_dir = tempfile.mkdtemp(prefix="identity-")
    st.admin_token = secrets.token_urlsafe(32)
    mf_env = dict(env, MESHFAST_DATA_DIR=st.data_dir, MESHFAST_ADMIN_TOKEN=st.admin_token)
    mf_env.pop("DATABASE_URL", None)
    st.meshfast = Server("meshfast", shlex.split(args.meshfast_cmd) + [
        "serve", "--workers", str(args.workers), "--host", "127.0.0.1", "--port", st.meshfast_url.rsplit(":", 1)[1]],
        mf_env, work_dir / "meshfast.log")
    doc: dict = {}
    fs = None
    try:
        upstream.start()
        st.meshfast.start()
        harness.wait_until(lambda: fb._answers(upstream_url + "/healthz"), 30.0, upstream, "an answer")
        harness.wait_until(lambda: harness.http_request("GET", st.meshfast_url + "/readyz", timeout_s=2.0)[0] == 200,
                           pb.MESHFAST_READY_TIMEOUT_S, st.meshfast, "GET /readyz == 200")
        fs = fb.FloorStack(meshfast=st.meshfast, meshfast_url=st.meshfast_url, admin_token=st.admin_token,
                           urls={"upstream": upstream_url})
        fs.groups.sessions["upstream"] = upstream.proc.pid
        fs.groups.sessions["meshfast"] = st.meshfast.proc.pid
        fs.groups.data_dirs["meshfast_postgres"] = st.data_dir
        fb.provision(fs)
        status, _, raw = harness.http_request("GET", f"{st.meshfast_url}/admin/users/{fs.user_id}",
                                              {"authorization": f"Bearer {st.admin_token}"}, timeout_s=10.0)
        if status != 200:
            raise BenchError(f"GET the bench user answered {status}")
        issuer, tokens = _issuer_and_tokens(json.loads(raw)["email"])
        harness.admin_create(st.meshfast_url, st.admin_token, "/admin/issuers", issuer)
        up_auth = {"authorization": f"Bearer {fb.UPSTREAM_KEY}", "content-type": "application/json"}
        targets = {"direct": loadgen.Target.post("direct", f"{upstream_url}/sse/v1/chat/completions", up_auth,
                                                 fb.STREAM_REQUEST % fb.RESOLVED.encode(), fb.SSE_END)}
        credentials = {"meshfast-key": fs.user_key, **{f"meshfast-jwt-{a.lower()}": t for a, t in tokens.items()}}
        for name, credential in credentials.items():
            targets[name] = loadgen.Target.post(name, f"{st.meshfast_url}/v1/proxy?model={fb.MODEL}",
                                                {"authorization": f"Bearer {credential}",
                                                 "content-type": "application/json"}, pb.PROXY_BODY, pb.NDJSON_END)

        for t in targets.values():
            for _ in range(4):  # every worker sees each token once: what follows is the cached path
                pb._exchange_once(t)
        print(f"[identity] one connection: {args.b2b_rounds} x {args.b2b_duration:g} s x {len(targets)} ...",
              flush=True)
        doc["back_to_back"] = fb.phase_back_to_back(args, fs, targets)
    finally:
        doc["stop"] = {"meshfast": st.meshfast.stop(), "upstream": upstream.stop()}
    reports = doc["back_to_back"]["targets"]
    doc["summary"] = {name: {"added_p50_us": rep.get("added_us", {}).get("p50"),
                             "added_p99_us": rep.get("added_us", {}).get("p99"),
                             "statuses": rep.get("statuses")}
                      for name, rep in reports.items() if name != "direct"}
    return doc


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--blocks", type=int, default=20, help="in-process: blocks per credential")
    p.add_argument("--block-calls", type=int, default=2000, help="in-process: calls per block (first sights: /20)")
    p.add_argument("--b2b-duration", type=float, default=3.0)
    p.add_argument("--b2b-rounds", type=int, default=4)
    p.add_argument("--skip", action="append", default=[], choices=("in_process", "proxy"))
    p.add_argument("--quick", action="store_true")
    p.add_argument("--meshfast-cmd", default=harness.default_meshfast_cmd(fallback=False))
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    if args.quick:
        args.blocks, args.block_calls, args.b2b_duration, args.b2b_rounds = 4, 500, 1.0, 2
    started = dt.datetime.now(dt.UTC)
    doc: dict = {
        "benchmark": "identity",
        "description": "authentication cost: an issued key vs platform tokens, in process and on the proxy path",
        **harness.run_header(sys.argv[1:], started, fb.provenance(argparse.Namespace(
            **{**vars(args), "loop": None, "only": None, "forwarder_rs": fb.FORWARDER_RS}))),
        "config": {k: str(v) for k, v in vars(args).items() if k != "out"},
        "note": NOTE,
        "background_cpu_busy_pct": harness.cpu_busy_pct(),
    }
    if "in_process" not in args.skip:
        doc["in_process"] = phase_in_process(args)
        print(json.dumps(doc["in_process"]["us"], indent=1))
    if "proxy" not in args.skip:
        with tempfile.TemporaryDirectory(prefix="identity-bench-") as work:
            doc["proxy"] = phase_proxy(args, Path(work))
        print(json.dumps(doc["proxy"]["summary"], indent=1))
    out = args.out or RESULTS_DIR / f"identity-{dt.datetime.now(dt.UTC):%Y%m%dT%H%M%SZ}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"[identity] {out}")
    problems = [f"{n}: status {s['statuses']}" for n, s in doc.get("proxy", {}).get("summary", {}).items()
                if set(s["statuses"] or {}) - {"200", 200}]
    for problem in problems:
        print(f"[identity] PROBLEM {problem}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
