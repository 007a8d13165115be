"""Prompt-cache shaping (issue "ecosystem", item 1): what a multi-turn agent costs with meshfast's
shaping and without it, against testserve's emulated prompt cache (`testserve/promptcache.py`).

The trace: a coding agent in OpenAI Chat format (the harness cannot place Anthropic breakpoints
itself) with a ~1,500-token system prompt and 12 tools; each turn repeats the conversation so far
and adds the model's tool call and a ~300-token tool result. Each arm runs the same trace as its
own person (so its rows add up alone) through `meshfast serve`:

- `anthropic`: an Anthropic-family upstream, shaping on (breakpoints, 5 minutes), then `1h` (a
  model with `cache_ttl: "1h"`), then off (`X-Meshfast-Cache: off`);
- `openai`: an OpenAI-family upstream, shaping on (`prompt_cache_key`), then off (four emulated
  machines: without the key, a prefix is found only when a call lands where it was cached).

Prices are per 1k tokens, like Claude Sonnet (input $0.003, output $0.015, cache read $0.0003, 5-minute
write $0.00375, one-hour write $0.006) and GPT-4.1 (input $0.002, output $0.008, cache read $0.0005).
Reported per arm, from the rows: cost, prompt tokens by class, and the hit rate (cache reads over all
prompt tokens).

    .venv/bin/python bench/cache_bench.py            # 20 turns per arm (~1 min)
    .venv/bin/python bench/cache_bench.py --quick    # 6 turns (the paper's CI run)
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import harness  # noqa: E402
from bench import proxy_bench as pb  # noqa: E402

RESULTS_DIR = ROOT / "bench" / "results"
SYSTEM = ("You are a coding agent for the payments platform. Follow the repository's conventions, "
          "run the tests before you answer, and explain each change in one sentence. ") * 36
TOOLS = [{"type": "function", "function": {
    "name": f"tool_{name}", "description": f"{name.replace('_', ' ').capitalize()} in the workspace.",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "query": {"type": "string"},
                                                    "limit": {"type": "integer"}}, "required": ["path"]}}}
    for name in ("read_file", "write_file", "list_dir", "grep", "run_tests", "git_diff", "git_log", "open_pr",
                 "search_docs", "lint", "format", "build")]
PRICES = {
    "anthropic": {"input_price_per_1k_tokens": "0.003", "output_price_per_1k_tokens": "0.015",
                  "cache_read_price_per_1k_tokens": "0.0003", "cache_write_price_per_1k_tokens": "0.00375",
                  "cache_write_1h_price_per_1k_tokens": "0.006"},
    "openai": {"input_price_per_1k_tokens": "0.002", "output_price_per_1k_tokens": "0.008",
               "cache_read_price_per_1k_tokens": "0.0005"},
}
# (arm, family, model suffix, model fields, request headers)
ARMS = (
    ("anthropic shaped (5 min)", "anthropic", "a5m", {}, {}),
    ("anthropic shaped (1 h)", "anthropic", "a1h", {"cache_ttl": "1h"}, {}),
    ("anthropic unshaped", "anthropic", "aoff", {}, {"x-meshfast-cache": "off"}),
    ("openai shaped (key)", "openai", "okey", {}, {}),
    ("openai unshaped", "openai", "ooff", {}, {"x-meshfast-cache": "off"}),
)


def _provision(st: pb.Stack) -> None:
    st.setup["models"] = {}
    for family in ("anthropic", "openai"):
        harness.admin_create(st.meshfast_url, st.admin_token, "/admin/providers", {
            "name": f"cache-{family}", "family": family, "base_url": f"{st.testserve_url}/{family}",
            "api_key": pb.TESTSERVE_KEY, "local": True, "verify": False, "models": []})
    providers = {p["name"]: p["id"] for p in _admin(st, "GET", "/admin/providers")}
    for _, family, suffix, fields, _ in ARMS:
        model = harness.admin_create(st.meshfast_url, st.admin_token, "/admin/models", {
            "provider_id": providers[f"cache-{family}"], "name": f"cache-{suffix}", "kind": "chat",
            "resolved_model": f"{suffix}-promptcache", "max_output_tokens": 256, "verify": False,
            **PRICES[family], **fields})
        st.setup["models"][suffix] = model["id"]


def _admin(st: pb.Stack, method: str, path: str, body: Any = None) -> Any:
    return harness.admin_call(st.meshfast_url, st.admin_token, method, path, body, expect=range(300), detail=300)


def _person(st: pb.Stack, model_id: str) -> dict[str, Any]:
    user = _admin(st, "POST", "/admin/users", {"email": f"cache-{model_id[:8]}@example.com",
                                               "display_name": "Cache bench"})
    _admin(st, "POST", "/admin/access", {"user_id": user["id"], "model_id": model_id})
    _admin(st, "PUT", f"/admin/users/{user['id']}/policies/{model_id}",
           {"daily_cap_usd": 1000, "max_calls_per_hour": None, "allowed_from": None, "allowed_to": None,
            "timezone": "UTC", "active_days": [0, 1, 2, 3, 4, 5, 6], "always_open": True})
    return user


def run_arm(st: pb.Stack, arm: tuple[str, str, str, dict[str, Any], dict[str, str]], turns: int) -> dict[str, Any]:
    name, family, suffix, _, headers = arm
    user = _person(st, st.setup["models"][suffix])
    auth = {"authorization": f"Bearer {user['key']}", **headers}

    def ready() -> bool:
        return any(m["id"] == f"cache-{suffix}" for m in json.loads(
            harness.http_request("GET", st.meshfast_url + "/v1/models", auth, timeout_s=5.0)[2]).get("data", []))

    harness.wait_until(ready, 30.0, st.meshfast, f"cache-{suffix} granted on a worker")
    messages: list[Any] = [{"role": "system", "content": SYSTEM},
                           {"role": "user", "content": "The nightly reconciliation job fails on March data; fix it."}]
    for turn in range(turns):
        status, _, raw = harness.http_request("POST", st.meshfast_url + "/v1/chat/completions", auth,
                                              {"model": f"cache-{suffix}", "messages": messages, "tools": TOOLS,
                                          "max_tokens": 256}, timeout_s=60.0)
        if status != 200:
            raise harness.BenchError(f"{name} turn {turn}: {status} {raw[:300]!r}")
        reply = json.loads(raw)["choices"][0]["message"].get("content") or ""
        call = f"call_{turn}"
        messages += [
            {"role": "assistant", "content": reply, "tool_calls": [
                {"id": call, "type": "function", "function": {"name": "tool_grep", "arguments": '{"path":"src"}'}}]},
            {"role": "tool", "tool_call_id": call,
             "content": json.dumps({"matches": [f"src/recon/job_{turn}_{i}.py:{i * 7}: total = sum(rows)"
                                                for i in range(18)]})},
        ]
    rows: list[dict[str, Any]] = []

    def all_rows() -> bool:
        nonlocal rows
        rows = _admin(st, "GET", f"/admin/logs?user_id={user['id']}&page_size=500")["logs"]
        return len(rows) >= turns

    harness.wait_until(all_rows, 30.0, st.meshfast, f"{turns} rows of {name}")
    prompt_in = sum(r["tokens_in"] for r in rows)
    read = sum(r["cache_read_tokens"] for r in rows)
    write = sum(r["cache_write_tokens"] for r in rows)
    cost = sum(r["input_cost"] + r["output_cost"] for r in rows)
    # A row's tokens_in counts neither cache class (the core's usage keeps the classes apart).
    prompt_total = prompt_in + read + write
    return {"arm": name, "family": family, "turns": turns, "calls": len(rows), "cost_usd": round(cost, 6),
            "prompt_tokens": prompt_total, "cache_read_tokens": read, "cache_write_tokens": write,
            "uncached_prompt_tokens": prompt_total - read - write,
            "hit_rate": round(read / prompt_total, 4) if prompt_total else 0.0,
            "output_tokens": sum(r["tokens_out"] for r in rows)}


def summarise(arms: list[dict[str, Any]]) -> dict[str, Any]:
    by = {a["arm"]: a for a in arms}
    out: dict[str, Any] = {}
    for family, shaped, plain in (("anthropic", "anthropic shaped (5 min)", "anthropic unshaped"),
                                  ("anthropic_1h", "anthropic shaped (1 h)", "anthropic unshaped"),
                                  ("openai", "openai shaped (key)", "openai unshaped")):
        if shaped in by and plain in by and by[plain]["cost_usd"]:
            out[f"{family}_saving"] = round(1 - by[shaped]["cost_usd"] / by[plain]["cost_usd"], 4)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="6 turns per arm")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--meshfast-cmd", default=f"{sys.executable} -m meshfast.cli")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    turns = 6 if args.quick else args.turns
    work = Path(tempfile.mkdtemp(prefix="cache-bench-"))
    started = dt.datetime.now(dt.UTC)
    prov = harness.provenance(argparse.Namespace(meshfast_cmd=args.meshfast_cmd, only="meshfast"))
    doc: dict[str, Any] = {**harness.run_header(argv, started, prov), "bench": "cache",
                           "started_at": started.isoformat(), "turns": turns, "prices_per_1k": PRICES, "arms": []}
    st = pb.start_stack(args, work, forwarder=False, provision=_provision)
    try:
        for arm in ARMS:
            print(f"[cache] {arm[0]}: {turns} turns ...", flush=True)
            doc["arms"].append(run_arm(st, arm, turns))
    finally:
        st.stop_into(doc)
    doc["summary"] = summarise(doc["arms"])
    print(f"\n{'arm':28} {'cost USD':>10} {'prompt tok':>11} {'read':>9} {'write':>9} {'hit rate':>9}")
    for a in doc["arms"]:
        print(f"{a['arm']:28} {a['cost_usd']:>10.4f} {a['prompt_tokens']:>11} {a['cache_read_tokens']:>9} "
              f"{a['cache_write_tokens']:>9} {a['hit_rate']:>9.1%}")
    print("savings:", ", ".join(f"{k} {v:.1%}" for k, v in doc["summary"].items()))
    out = args.out or RESULTS_DIR / f"cache-{dt.datetime.now(dt.UTC).strftime('%Y%m%dT%H%M%SZ')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    print(f"results: {out}")
    problems = [f"{k}: shaping did not save ({v:.1%})" for k, v in doc["summary"].items() if v <= 0]
    for problem in problems:
        print(f"PROBLEM: {problem}")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
