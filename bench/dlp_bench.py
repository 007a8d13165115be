"""Data protection (issue 17, "Speed"): the scanner's throughput in process, and with `--proxy` what
a policy adds to the proxy path.

Scanner: `bench/dlp-corpus.txt`, 64 KiB of prose with 16 kinds of sensitive values and 16 kinds of near
misses mixed in (the same corpus `make instructions` counts, workload `dlp_scan`). Each round scans it
whole with every built-in detector through `meshfast._core.dlp_scan` (the GIL released); the result is
MB/s at the median and the fastest round, and the matches found per detector.

Proxy (`--proxy`): floor_bench's fast upstream (nginx answering a fixed 1.7 KB OpenAI stream, the
request body discarded) and one `meshfast serve --workers N` with its embedded PostgreSQL, provisioned
as floor_bench does (one provider and model, a governed person: `off`), plus a second person with the
same grant and budget (`on`) whom one data protection policy covers: every built-in detector set to
`redact`. For each prompt size (`--sizes`: 1, 32, 512 KiB of the corpus, repeated and cut to size, so
it carries realistic values) and each route (`/v1/proxy?model=` with `{"query": prompt}`, and a
non-streamed `/v1/chat/completions` with the prompt as the user message), the off and on calls take
turns on one client (`loadgen.sequential`: one keep-alive connection per target, one request at a
time, the targets alternating), `--count` each. Reported: p50/p90/p99 of time to last byte, on and
off, the added latency (on pN - off pN, a difference of percentiles) at p50, p90 and p99, and
`dlp_scan`'s own time on the same prompt in this process (idle servers) beside it. Before timing, the
policy must be on every worker (a `block` version refuses 8 fresh connections in a row, then the
`redact` version passes 8 in a row), and one call per size, route and person is looked up in
`/admin/logs`: `on` rows must say `redact` with what was found, `off` rows nothing.

    .venv/bin/python bench/dlp_bench.py                    # scanner, ~10 s
    .venv/bin/python bench/dlp_bench.py --quick            # scanner, ~2 s
    .venv/bin/python bench/dlp_bench.py --proxy            # and the proxy path, ~2 min
    .venv/bin/python bench/dlp_bench.py --proxy --quick    # smoke check, ~40 s
"""

from __future__ import annotations

import argparse
import collections
import datetime as dt
import gc
import json
import secrets
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import floor_bench as fb  # noqa: E402
from bench import harness, loadgen  # noqa: E402
from bench import proxy_bench as pb  # noqa: E402
from bench.harness import BenchError, Server  # noqa: E402
from meshfast._core import dlp_scan  # noqa: E402

CORPUS = ROOT / "bench" / "dlp-corpus.txt"
RESULTS_DIR = ROOT / "bench" / "results"

SIZES = (1024, 32 * 1024, 512 * 1024)
ROUTES = ("proxy", "chat")
POLICY_NAME = "bench-dlp"
DETECTORS = ("card", "iban", "email", "phone", "ssn", "ip", "secret")
PROBE_QUERY = "pay with 4111 1111 1111 1111 today"  # a Luhn-valid card: refused while the policy blocks
ROW_TIMEOUT_S = 15.0
PERCENTILES = ("p50", "p90", "p99")

NOTE = ("nginx, the gateway with its embedded PostgreSQL and the load generator share this machine's CPUs "
        "unpinned, with whatever else runs on it (each size's cpu.other_busy_pct). Off and on are two people "
        "on the same gateway, same model and budget; only the policy differs. Added latency is a difference "
        "of percentiles (on pN - off pN), not a percentile of differences. The scanner column is "
        "meshfast._core.dlp_scan on the same prompt in the bench process, one call timed at a time "
        "(perf_counter_ns); the gateway also rewrites what it found and re-encodes the upstream body.")


# ------------------------------------------------------------------------------------------ scanner


def _us(ns: list[int]) -> dict[str, float]:
    s = sorted(ns)
    return {"median": round(statistics.median(s) / 1000, 1), "p99": round(loadgen.percentile(s, 99.0) / 1000, 1),
            "best": round(s[0] / 1000, 1)}


def scan_times(text: str, rounds: int) -> tuple[list[int], list[tuple[str, int, int]]]:
    """`rounds` timed scans of `text`, one at a time (nanoseconds), and what the last one found."""
    dlp_scan(text)  # builds the scanner
    clock, times = time.perf_counter_ns, []
    found: list[tuple[str, int, int]] = []
    gc.disable()
    try:
        for _ in range(rounds):
            t0 = clock()
            found = dlp_scan(text)
            times.append(clock() - t0)
    finally:
        gc.enable()
    return times, found


def phase_scanner(rounds: int) -> dict:
    text = CORPUS.read_text()
    size = len(text.encode())
    times, found = scan_times(text, rounds)
    median_s, best_s = statistics.median(times) / 1e9, min(times) / 1e9
    return {"rounds": rounds,
            "mb_per_s": {"median": round(size / median_s / 1e6, 1), "best": round(size / best_s / 1e6, 1)},
            "scan_ms": {"median": round(median_s * 1000, 3), "best": round(best_s * 1000, 3)},
            "matches": dict(sorted(collections.Counter(d for d, _, _ in found).items()))}


def prompt_of(size: int) -> str:
    """`size` bytes of the corpus (ASCII prose), repeated and cut: realistic values at a realistic density."""
    corpus = CORPUS.read_text()
    return (corpus * (size // len(corpus) + 1))[:size]


# -------------------------------------------------------------------------------------------- proxy


def start_stack(args, work_dir: Path) -> fb.FloorStack:
    """nginx and one gateway, provisioned as floor_bench does (its person is `off`)."""
    env = fb.server_env(argparse.Namespace(loop=None))
    port = harness.free_port()
    conf = work_dir / "nginx.conf"
    # NOTE: the chat route's upstream body for a 512 KiB prompt nears nginx's default 1 MiB body limit (413).
    conf.write_text(fb.nginx_conf(work_dir, port, 1).replace("access_log off;",
                                                             "access_log off;\n    client_max_body_size 0;"))
    st = fb.FloorStack(urls={"upstream": f"http://127.0.0.1:{port}"})
    st.extra["upstream"] = harness.nginx_server(work_dir, conf, env)
    st.meshfast_url = f"http://127.0.0.1:{harness.free_port()}"
    st.data_dir = tempfile.mkdtemp(prefix="meshfast-dlp-")
    st.admin_token = secrets.token_urlsafe(32)
    mf_env = dict(env, MESHFAST_DATA_DIR=st.data_dir, MESHFAST_ADMIN_TOKEN=st.admin_token)
    mf_env.pop("DATABASE_URL", None)  # the embedded database a fresh install gets
    st.meshfast = Server("meshfast", shlex.split(args.meshfast_cmd) + [
        "serve", "--workers", str(args.workers), "--host", "127.0.0.1", "--port", st.meshfast_url.rsplit(":", 1)[1]],
        mf_env, work_dir / "meshfast.log")
    try:
        for s in st.servers():
            s.start()
            st.groups.sessions[s.name] = s.proc.pid
        st.groups.data_dirs["meshfast_postgres"] = st.data_dir
        st.setup["upstream_ready_s"] = harness.wait_until(lambda: fb._answers(st.urls["upstream"] + "/healthz"),
                                                          fb.READY_TIMEOUT_S, st.extra["upstream"], "an answer")
        st.setup["meshfast_ready_s"] = harness.wait_until(
            lambda: harness.http_request("GET", st.meshfast_url + "/readyz", timeout_s=2.0)[0] == 200,
            pb.MESHFAST_READY_TIMEOUT_S, st.meshfast, "GET /readyz == 200")
        fb.provision(st)
    except BaseException:
        st.stop()
        raise
    return st


def _admin(st: pb.Stack, method: str, path: str, body: object | None = None) -> dict:
    return harness.admin_call(st.meshfast_url, st.admin_token, method, path, body, empty={})


def _proxy_status(st: pb.Stack, key: str, query: str) -> int:
    """One `/v1/proxy` call on a fresh connection (either worker may take it)."""
    return harness.http_request("POST", f"{st.meshfast_url}/v1/proxy?model={fb.MODEL}", {"authorization": f"Bearer {key}"},
                                {"query": query, "max_tokens": 64}, timeout_s=10.0)[0]


def _until_in_a_row(st: pb.Stack, check, what: str) -> float:
    seen = 0

    def steady() -> bool:
        nonlocal seen
        seen = seen + 1 if check() else 0
        return seen >= pb.PROPAGATION_CONFIRMATIONS

    return harness.wait_until(steady, pb.CONFIG_PROPAGATION_TIMEOUT_S, st.meshfast, what)


def provision_on(st: fb.FloorStack) -> dict:
    """The second person (same grant and budget as floor_bench's) and the policy that covers only them,
    on every worker before anything is timed."""
    person = harness.admin_create(st.meshfast_url, st.admin_token, "/admin/users",
                                  {"email": "bench-dlp@example.com", "display_name": "Bench DLP"})
    listed = _admin(st, "GET", "/admin/models")
    models = listed if isinstance(listed, list) else listed.get("models") or listed.get("data") or []
    model_id = next(m["id"] for m in models if m["name"] == fb.MODEL)
    _admin(st, "POST", "/admin/access", {"user_id": person["id"], "model_id": model_id})
    _admin(st, "PUT", f"/admin/users/{person['id']}/policies/{model_id}", fb.POLICY)
    as_on = replace(st, user_key=person["key"], setup={})
    pb.wait_for_models(as_on, 1, "the second person's grant on every worker")
    applies = {"users": [person["id"]]}
    # A `block` version first: its refusals show it reached every worker, which a redaction cannot.
    _admin(st, "PUT", f"/admin/dlp/policies/{POLICY_NAME}",
           {"enabled": True, "detectors": {"card": "block"}, "applies_to": applies})
    block_s = _until_in_a_row(st, lambda: _proxy_status(st, person["key"], PROBE_QUERY) == 400,
                              "the blocking policy on every worker")
    if _proxy_status(st, st.user_key, PROBE_QUERY) != 200:
        raise BenchError("the policy for one person refused another's call")
    policy = {"enabled": True, "detectors": {d: "redact" for d in DETECTORS}, "applies_to": applies}
    stored = _admin(st, "PUT", f"/admin/dlp/policies/{POLICY_NAME}", policy)
    redact_s = _until_in_a_row(st, lambda: _proxy_status(st, person["key"], PROBE_QUERY) == 200,
                               "the redacting policy on every worker")
    return {"user_id": person["id"], "key": person["key"], "policy": policy, "policy_version": stored.get("version"),
            "propagation_s": {"grant": as_on.setup["propagation_s"], "block": block_s, "redact": redact_s}}


def _bodies(prompt: str) -> dict[str, bytes]:
    """Each route's request for the prompt: the Mesh query, and the OpenAI chat's one user message."""
    proxy = {"query": prompt, "max_tokens": 64}
    chat = {"model": fb.MODEL, "max_tokens": 64, "messages": [{"role": "user", "content": prompt}]}
    return {"proxy": json.dumps(proxy, separators=(",", ":")).encode(),
            "chat": json.dumps(chat, separators=(",", ":")).encode()}


def _path(route: str) -> str:
    return f"/v1/proxy?model={fb.MODEL}" if route == "proxy" else "/v1/chat/completions"


def row_of(st: pb.Stack, request_id: str) -> dict:
    """The call's row in /admin/logs (written behind the answer, so polled)."""
    deadline = time.monotonic() + ROW_TIMEOUT_S
    while time.monotonic() < deadline:
        logs = _admin(st, "GET", f"/admin/logs?request_id={request_id}").get("logs") or []
        if logs:
            return {k: logs[0].get(k) for k in ("route", "status_code", "outcome", "latency_ms", "tokens_in", "dlp",
                                                "dlp_action")}
        time.sleep(0.2)
    raise BenchError(f"no row for request {request_id} within {ROW_TIMEOUT_S} s")


def check_rows(st: pb.Stack, keys: dict[str, str], bodies: dict[str, bytes], routes: tuple[str, ...]) -> dict:
    """One call per route and person outside the timing: 200, and its row says what the policy did."""
    out: dict = {}
    for route in routes:
        for side, key in keys.items():
            status, headers, raw = _post_raw(st.meshfast_url + _path(route), key, bodies[route])
            if status != 200:
                raise BenchError(f"{route} {side}: answered {status}: {raw[:300]!r}")
            request_id = {k.lower(): v for k, v in headers.items()}.get("x-request-id")
            if not request_id:
                raise BenchError(f"{route} {side}: no x-request-id")
            row = row_of(st, request_id)
            if side == "on" and row["dlp_action"] != "redact":
                raise BenchError(f"{route} on: the row says dlp_action {row['dlp_action']!r}, not 'redact': {row}")
            if side == "off" and (row["dlp"] or row["dlp_action"]):
                raise BenchError(f"{route} off: the row says the policy acted: {row}")
            out[f"{route}-{side}"] = row
    return out


def _post_raw(url: str, key: str, body: bytes) -> tuple[int, dict[str, str], bytes]:
    """harness.http_request with a body already encoded (the prompt is not encoded twice)."""
    req = urllib.request.Request(url, data=body, method="POST",
                                 headers={"authorization": f"Bearer {key}", "content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30.0) as resp:
            return resp.status, dict(resp.headers.items()), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers.items()), exc.read()


def measure_size(args, st: fb.FloorStack, keys: dict[str, str], size: int) -> dict:
    prompt = prompt_of(size)
    bodies = _bodies(prompt)
    rows = check_rows(st, keys, bodies, args.routes)
    expect = {"proxy": pb.NDJSON_END, "chat": fb.JSON_END}
    targets = [loadgen.Target.post(f"{route}-{side}", st.meshfast_url + _path(route),
                                   {"authorization": f"Bearer {key}", "content-type": "application/json"},
                                   bodies[route], expect[route])
               for route in args.routes for side, key in keys.items()]
    meter = pb.CpuMeter(st.groups)
    series = loadgen.sequential(targets, args.count, warmup_requests=5, pause_s=args.pause_s)
    cpu = meter.stop()
    st.check_alive()
    reports = {s.target: s.report(raw=False) for s in series}
    routes = {}
    for route in args.routes:
        off, on = reports[f"{route}-off"]["total_us"], reports[f"{route}-on"]["total_us"]
        routes[route] = {"off_us": {p: off.get(p) for p in PERCENTILES}, "on_us": {p: on.get(p) for p in PERCENTILES},
                         "added_us": {p: round(on[p] - off[p], 1) for p in PERCENTILES if p in on and p in off},
                         "request_bytes": len(bodies[route])}
    times, found = scan_times(prompt, args.scan_rounds)
    return {"prompt_bytes": size, "rows": rows, "cpu": cpu, "routes": routes,
            "scanner_us": {**_us(times), "rounds": len(times),
                           "matches": dict(sorted(collections.Counter(d for d, _, _ in found).items()))},
            "targets": reports}


def phase_proxy(args, work_dir: Path) -> tuple[dict, list[str]]:
    doc: dict = {"sizes": []}
    failures: list[str] = []
    st = None
    try:
        print(f"[dlp] starting nginx and meshfast ({args.workers} workers) ...", flush=True)
        st = start_stack(args, work_dir)
        on = provision_on(st)
        keys = {"off": st.user_key, "on": on.pop("key")}
        doc["setup"] = {**st.setup, "on": on, "off": {"user_id": st.user_id}}
        doc["servers"] = {s.name: shlex.join(harness.redact(s.argv, [*st.secrets(), keys["on"]])) for s in st.servers()}
        for size in args.sizes:
            print(f"[dlp] {size:,} B prompt: {len(args.routes)} routes x off/on x {args.count} ...", flush=True)
            result = measure_size(args, st, keys, size)
            doc["sizes"].append(result)
            for name, rep in result["targets"].items():
                if rep["error_count"]:
                    failures.append(f"{size} B {name}: {rep['error_count']} errors, e.g. {rep['errors'][:2]}")
        doc["telemetry"] = pb.settled_telemetry(st.meshfast_url, st.admin_token)
    except BenchError as exc:
        failures.append(str(exc))
        print(f"[dlp] FAILED: {exc}", file=sys.stderr)
    except (KeyboardInterrupt, subprocess.TimeoutExpired) as exc:
        failures.append(f"interrupted: {exc!r}")
    finally:
        if st is not None:
            st.stop_into(doc)
    return doc, failures


# -------------------------------------------------------------------------------------------- table


_f = harness.format_number


def show(doc: dict) -> None:
    print(f"scanner: corpus {doc['provenance']['bytes']:,} bytes: {doc['mb_per_s']['median']} MB/s median, "
          f"{doc['mb_per_s']['best']} MB/s best ({doc['scan_ms']['median']} ms a scan); matches {doc['matches']}")
    proxy = doc.get("proxy")
    if not proxy or not proxy.get("sizes"):
        return
    print(f"\nproxy path, {doc['config']['workers']} workers, nginx upstream; latency in us, time to last byte, "
          f"{doc['config']['count']} calls per target, off/on interleaved; added = on - off")
    print(f"{'prompt':>8} {'route':<6}{'off p50':>9}{'p90':>8}{'p99':>8}{'on p50':>9}{'p90':>8}{'p99':>8}"
          f"{'+p50':>8}{'+p90':>8}{'+p99':>8}{'scan p50':>10}{'other%':>8}")
    for s in proxy["sizes"]:
        for route, r in s["routes"].items():
            off, on, add = r["off_us"], r["on_us"], r["added_us"]
            print(f"{s['prompt_bytes'] // 1024:>6}KB {route:<6}{_f(off['p50']):>9}{_f(off['p90']):>8}{_f(off['p99']):>8}"
                  f"{_f(on['p50']):>9}{_f(on['p90']):>8}{_f(on['p99']):>8}{_f(add.get('p50')):>8}"
                  f"{_f(add.get('p90')):>8}{_f(add.get('p99')):>8}{_f(s['scanner_us']['median']):>10}"
                  f"{_f(s['cpu'].get('other_busy_pct')):>8}")
    print("scanner matches per prompt: " + "; ".join(
        f"{s['prompt_bytes'] // 1024} KB {sum(s['scanner_us']['matches'].values())}" for s in proxy["sizes"]))
    other = max((s["cpu"].get("other_busy_pct") or 0 for s in proxy["sizes"]), default=0)
    if other > harness.BUSY_WARN_PCT:
        print(f"WARNING: other processes used up to {other:.0f}% of the CPUs during a size (other%); numbers are noisy")
    print(f"background cpu before the run: {doc.get('background_cpu_busy_pct')}%; "
          f"loadavg at start {doc['provenance']['host']['loadavg_at_start']}")


# --------------------------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=300, help="scanner: scans of the corpus")
    p.add_argument("--proxy", action="store_true", help="also the proxy path with the policy on and off")
    p.add_argument("--workers", type=int, default=2, help="proxy: the gateway's Granian workers")
    p.add_argument("--sizes", type=lambda s: tuple(int(x) for x in s.split(",")), default=SIZES,
                   help="proxy: prompt sizes in bytes, comma separated")
    p.add_argument("--routes", type=lambda s: tuple(s.split(",")), default=ROUTES, help="proxy: proxy,chat")
    p.add_argument("--count", type=int, default=500, help="proxy: timed calls per size, route and side")
    p.add_argument("--pause-s", type=float, default=0.005, help="proxy: pause after each call")
    p.add_argument("--scan-rounds", type=int, default=200, help="proxy: in-process scans of each prompt")
    p.add_argument("--quick", action="store_true", help="30 scans; proxy: 30 calls per target, 30 scans per prompt")
    p.add_argument("--meshfast-cmd", default=harness.default_meshfast_cmd(fallback=False),
                   help="command that takes `serve ...` (meshfast is imported from the working tree)")
    p.add_argument("--out", type=Path, help="result JSON (default bench/results/dlp-<timestamp>.json)")
    args = p.parse_args(argv)
    if set(args.routes) - set(ROUTES):
        p.error(f"--routes: one or more of {','.join(ROUTES)}")
    if args.quick:
        args.rounds, args.count, args.scan_rounds = 30, 30, 30
    args.only, args.loop, args.forwarder_rs = None, None, fb.FORWARDER_RS  # what the provenance helpers read
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.proxy:
        missing = [f"{tool} missing: apt-get install -y {tool}" for tool in ("nginx",) if not shutil.which(tool)]
        if missing:
            print("[dlp] " + "\n[dlp] ".join(missing), file=sys.stderr)
            return 2
    started = dt.datetime.now(dt.UTC)
    out = args.out or RESULTS_DIR / f"dlp-{started:%Y%m%dT%H%M%SZ}.json"
    prov = {"corpus": str(CORPUS.relative_to(ROOT)), "bytes": len(CORPUS.read_bytes()),
            **(fb.provenance(args) if args.proxy else harness.provenance(args))}
    doc = {**harness.run_header(argv, started, prov),
           "benchmark": "dlp",
           "config": {"quick": args.quick, "rounds": args.rounds, "proxy": args.proxy, "workers": args.workers,
                      "sizes_bytes": list(args.sizes), "routes": list(args.routes), "count": args.count,
                      "pause_s": args.pause_s, "scan_rounds": args.scan_rounds, "detectors": list(DETECTORS)},
           "background_cpu_busy_pct": harness.cpu_busy_pct() if args.proxy else None,
           **phase_scanner(args.rounds)}
    failures: list[str] = []
    if args.proxy:
        doc["note"] = NOTE
        with tempfile.TemporaryDirectory(prefix="meshfast-dlp-bench-") as work:
            doc["proxy"], failures = phase_proxy(args, Path(work))
        doc["summary"] = [{"prompt_bytes": s["prompt_bytes"], "scanner_median_us": s["scanner_us"]["median"],
                           **{route: {k: r[k] for k in ("off_us", "on_us", "added_us")}
                              for route, r in s["routes"].items()}}
                          for s in doc["proxy"]["sizes"]]
    return harness.finish(doc, failures, started, out, "dlp", show)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    sys.exit(main())
