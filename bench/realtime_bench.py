"""Realtime sessions (issue "ecosystem", item 2): what the relay adds to a response.

One run starts testserve (1 worker, its emulated OpenAI Realtime endpoint) and meshfast, then opens
one session straight to testserve and one through meshfast (`GET /v1/realtime`), and times
responses on both in alternating rounds, back to back: `response.create` with `max_output_tokens`
8 until the first `response.output_text.delta` (time to first delta) and until `response.done`.
Through meshfast each response is decided, reserved, admitted, priced and recorded (a row each),
so the added time is the per-response governance plus two WebSocket hops. Also: the time to open a
session (connect until `session.created`), direct and through meshfast, over `--sessions` sessions.

    .venv/bin/python bench/realtime_bench.py            # ~30 s
    .venv/bin/python bench/realtime_bench.py --quick    # smoke check (~15 s)
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
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

from bench import harness  # noqa: E402
from bench.harness import BenchError, Server  # noqa: E402

RESULTS_DIR = ROOT / "bench" / "results"
NOTE = ("testserve, meshfast (with its embedded PostgreSQL) and the client share this machine's CPUs unpinned. "
        "Added time is a difference of percentiles (meshfast pN - direct pN).")
TESTSERVE_KEY = "testserve-key"


def _pcts(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)

    def at(p: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(p * len(ordered)))] * 1000, 3)

    return {"n": len(ordered), "p50_ms": at(0.5), "p90_ms": at(0.9), "p99_ms": at(0.99),
            "mean_ms": round(statistics.fmean(ordered) * 1000, 3)}


async def _open(url: str, headers: dict[str, str]) -> tuple[object, float]:
    from websockets.asyncio.client import connect

    started = time.perf_counter()
    ws = await connect(url, additional_headers=headers, max_size=None)
    while json.loads(await ws.recv())["type"] != "session.created":
        pass
    return ws, time.perf_counter() - started


async def _response(ws) -> tuple[float, float]:
    started = time.perf_counter()
    await ws.send(json.dumps({"type": "response.create", "response": {"max_output_tokens": 8}}))
    first = None
    while True:
        event = json.loads(await ws.recv())
        if event["type"] == "response.output_text.delta" and first is None:
            first = time.perf_counter() - started
        elif event["type"] == "response.done":
            return first or 0.0, time.perf_counter() - started
        elif event["type"] == "error":
            raise BenchError(f"a response was refused: {event}")


async def measure(urls: dict[str, tuple[str, dict[str, str]]], rounds: int, sessions: int) -> dict:
    opened: dict[str, list[float]] = {name: [] for name in urls}
    for _ in range(sessions):
        for name, (url, headers) in urls.items():
            ws, took = await _open(url, headers)
            opened[name].append(took)
            await ws.close()
    conns = {name: (await _open(url, headers))[0] for name, (url, headers) in urls.items()}
    first: dict[str, list[float]] = {name: [] for name in urls}
    done: dict[str, list[float]] = {name: [] for name in urls}
    try:
        for _ in range(max(1, rounds // 10)):  # warm-up
            for ws in conns.values():
                await _response(ws)
        for i in range(rounds):
            order = list(conns.items()) if i % 2 == 0 else list(reversed(conns.items()))
            for name, ws in order:
                f, d = await _response(ws)
                first[name].append(f)
                done[name].append(d)
    finally:
        for ws in conns.values():
            await ws.close()
    out = {name: {"open": _pcts(opened[name]), "first_delta": _pcts(first[name]), "done": _pcts(done[name])}
           for name in urls}
    for phase in ("open", "first_delta", "done"):
        out.setdefault("added", {})[phase] = {
            k: round(out["meshfast"][phase][k] - out["direct"][phase][k], 3) for k in ("p50_ms", "p99_ms")}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=400)
    parser.add_argument("--sessions", type=int, default=40)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--meshfast-cmd", default=f"{sys.executable} -m meshfast")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.sessions = 60, 10
    started = dt.datetime.now(dt.UTC)
    work_dir = Path(tempfile.mkdtemp(prefix="realtime-bench-"))
    env = dict(os.environ)
    ts_port, mf_port = harness.free_port(), harness.free_port()
    ts_url, mf_url = f"http://127.0.0.1:{ts_port}", f"http://127.0.0.1:{mf_port}"
    admin_token = secrets.token_urlsafe(32)
    testserve = Server("testserve", [sys.executable, "-m", "testserve", "--host", "127.0.0.1", "--port",
                                     str(ts_port), "--workers", "1"], env, work_dir / "testserve.log")
    mf_env = dict(env, MESHFAST_DATA_DIR=str(work_dir / "data"), MESHFAST_ADMIN_TOKEN=admin_token)
    mf_env.pop("DATABASE_URL", None)
    meshfast = Server("meshfast", shlex.split(args.meshfast_cmd) + [
        "serve", "--workers", str(args.workers), "--host", "127.0.0.1", "--port", str(mf_port)],
        mf_env, work_dir / "meshfast.log")
    failures: list[str] = []
    doc: dict = {**harness.run_header(sys.argv[1:], started, {"git_sha": _git_sha(), "workers": args.workers}),
                 "config": {"rounds": args.rounds, "sessions": args.sessions, "max_output_tokens": 8}, "note": NOTE}
    try:
        testserve.start()
        meshfast.start()
        harness.wait_until(lambda: harness.http_request("GET", ts_url + "/healthz", timeout_s=2.0)[0] == 200, 30.0,
                           testserve, "testserve /healthz")
        harness.wait_until(lambda: harness.http_request("GET", mf_url + "/readyz", timeout_s=2.0)[0] == 200, 120.0,
                           meshfast, "meshfast /readyz")
        provider = harness.admin_create(mf_url, admin_token, "/admin/providers", {
            "name": "rt-bench", "family": "openai", "base_url": f"{ts_url}/openai", "api_key": TESTSERVE_KEY,
            "local": True, "verify": False})
        model = harness.admin_create(mf_url, admin_token, "/admin/models", {
            "provider_id": provider["id"], "name": "rt-bench-model", "resolved_model": "gpt-realtime-bench",
            "kind": "chat", "input_price_per_1k_tokens": "0.001", "output_price_per_1k_tokens": "0.002",
            "verify": False})
        user = harness.admin_create(mf_url, admin_token, "/admin/users", {"email": "rt-bench@example.com",
                                                                    "display_name": "rt bench"})
        status, _, _ = harness.http_request("POST", mf_url + "/admin/access", {"authorization": f"Bearer {admin_token}"},
                                            {"user_id": user["id"], "model_id": model["id"]}, timeout_s=10.0)
        if status != 200:
            raise BenchError(f"the grant answered {status}")
        time.sleep(1.5)  # every worker has the grant
        urls = {
            "direct": (f"ws://127.0.0.1:{ts_port}/openai/v1/realtime?model=gpt-realtime-bench",
                       {"authorization": f"Bearer {TESTSERVE_KEY}"}),
            "meshfast": (f"ws://127.0.0.1:{mf_port}/v1/realtime?model=rt-bench-model",
                         {"authorization": f"Bearer {user['key']}"}),
        }
        doc["results"] = asyncio.run(measure(urls, args.rounds, args.sessions))
    except (BenchError, OSError) as exc:
        failures.append(str(exc))
    finally:
        for server in (meshfast, testserve):
            server.stop()
    out = args.out or RESULTS_DIR / f"realtime-{dt.datetime.now(dt.UTC):%Y%m%dT%H%M%SZ}.json"
    return harness.finish(doc, failures, started, out, "realtime", _print)


def _git_sha() -> str:
    import subprocess

    done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


def _print(doc: dict) -> None:
    results = doc.get("results")
    if not results:
        return
    print(f"{'':10} {'phase':12} {'p50 ms':>9} {'p90 ms':>9} {'p99 ms':>9}")
    for name in ("direct", "meshfast"):
        for phase in ("open", "first_delta", "done"):
            r = results[name][phase]
            print(f"{name:10} {phase:12} {r['p50_ms']:9.3f} {r['p90_ms']:9.3f} {r['p99_ms']:9.3f}")
    for phase, added in results["added"].items():
        print(f"{'added':10} {phase:12} {added['p50_ms']:9.3f} {'':9} {added['p99_ms']:9.3f}")


if __name__ == "__main__":
    sys.exit(main())
