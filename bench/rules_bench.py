"""Spend rules (issue 14, "Speed"): no overshoot under oversubscription, what a decision costs, what rules
add to the proxy path, how big the shared memory gets, how fast a change reaches the workers.

Phases (each can be left out with `--skip NAME`):

- `oversubscription`: `meshfast serve --workers W` with testserve as the upstream. Two models share a
  fresh tag; one person holds both. A call costs exactly its worst case ($0.003: input free, `max_tokens`
  3 answered with 3 tokens at $1 per 1k output), so a threshold of N x $0.003 admits N calls. Then
  multiple x N calls at once (each on its own connection, alternating the two models; testserve holds
  every answer ~60 ms so they overlap) against: one `block` entry on the tag (4x and 10x, `--repeats`
  times each); two rules (the tag at N calls and a weekly one on the first model alone at N/2); the one
  rule in shadow mode. Reported per trial: admitted, refused (429 naming the rule), testserve's peak in
  flight, the spend recorded in the rows (`/admin/logs`, status 200) against each threshold, what
  `/v1/usage` says, and the overshoot (must be 0); after the burst, calls one at a time until refused
  (the cap then fills to exactly N). Shadow: refusals must be 0, rows past the cap name the rule in
  `would_deny`.
- `in_process`: `Core.prepare` + `Prepared.settle` in this process, one call timed at a time, on the
  gate's large configuration (`tests/bench/test_core_gates.py` `_rules_config`: 100 rules of 2
  entries, `--scale-users` people, 200 models, 10 grants each), once with the 100 rules and once
  with none (the same snapshot otherwise); blocks of calls alternate between the two cores. Also the
  snapshot's load time, and shared-memory slots per active user x model pair (every grant of the
  200 callers made active once, before the timing).
- `instructions`: callgrind's count of `rules::decide` (bench/instructions.py's `rule_decision`
  workload: 10,000 decisions), per decision.
- `proxy`: floor_bench's fast upstream (nginx, a fixed 1.7 KB OpenAI stream) and two gateways of the
  same build side by side: `meshfast-norules` (floor_bench's provisioning: one provider, model, user)
  and `meshfast-rules` (the same, plus `--extra-users` people in a reporting tree and `--rules`
  rules of 2 entries each on the called model; the bench user sits in some of their populations).
  Back to back on one connection (rounds alternate targets) for added p50/p99 over direct, then
  wrk at `--connections` for req/s and worker CPU per call (floor_bench's phases).
- `shm`: the segment file with default settings (what `meshfast serve` creates); then every one of
  the in-process config's person x model pairs (1,000,000 at full scale) makes a call and is
  checkpointed, in a segment sized as the settings' help says (7.2 slots per pair): its size,
  occupancy and slots per pair, and one decision's time there (callers spread over every pair, and
  200 hot ones).
- `propagation`: tests/test_rules_scale.py (500,000 grants on a 2-worker gateway) run with `-s`:
  its "full rebuild X s; reorg Y ms; new rule Z ms" line.

    .venv/bin/python bench/rules_bench.py            # full: ~7 min
    .venv/bin/python bench/rules_bench.py --quick    # smoke check for the paper's CI run (~1 min)
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import gc
import importlib.util
import json
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import floor_bench as fb  # noqa: E402
from bench import harness, loadgen  # noqa: E402
from bench import proxy_bench as pb  # noqa: E402
from bench.harness import BenchError, Server  # noqa: E402

RESULTS_DIR = ROOT / "bench" / "results"
PHASES = ("oversubscription", "in_process", "instructions", "proxy", "shm", "start", "propagation")

CALL_USD = Decimal("0.003")
PROMPT, MAX_TOKENS = "hello", 3
# testserve holds each delta this long, so a burst's calls overlap and hold their reservations together.
DELTA_DELAY_MS = 20
PROPAGATION_CONFIRMATIONS = 8
GOAL_DECISION_US = 10.0
GOAL_SHM_MB = 256
ACTIVE_PAIRS_GOAL = 1_000_000
SLOT_BYTES = 32
# MESHFAST_SHM_SLOTS per active pair, as the settings' help sizes it (7,200,000 for a million).
SHM_SLOTS_PER_PAIR = 7.2
RULE_DECISION_CALLS = 10_000  # core/examples/instructions.rs rule_decision
SCALE_LINE = re.compile(r"full rebuild ([\d.]+) s; reorg (\d+) ms; new rule (\d+) ms")

NOTE = (
    "Everything (testserve or nginx, the gateways with their embedded PostgreSQL, the load generator, wrk) "
    "shares this machine's CPUs unpinned with whatever else runs on it: read each phase's cpu.other_busy_pct "
    "and background_cpu_busy_pct. Added latency is a difference of percentiles (target pN - direct pN). "
    "The in-process times are single calls timed with perf_counter_ns (its own cost, ~0.1 us, included)."
)


# ------------------------------------------------------------------------------------- helpers


def _admin(st: pb.Stack, method: str, path: str, body: object | None = None,
           expect: tuple[int, ...] = (200, 201, 204)) -> dict:
    return harness.admin_call(st.meshfast_url, st.admin_token, method, path, body, expect=expect,
                              timeout_s=60.0, empty={})


def _usage_rules(st: pb.Stack, key: str) -> dict[str, dict] | None:
    status, _, raw = harness.http_request("GET", st.meshfast_url + "/v1/usage", {"authorization": f"Bearer {key}"},
                                          timeout_s=5.0)
    return {r["id"]: r for r in json.loads(raw).get("rules", [])} if status == 200 else None


def _wait_rules(st: pb.Stack, key: str, rule_ids: set[str], what: str) -> float:
    """Until several fresh connections in a row (either worker) show exactly `rule_ids` to the caller."""
    seen = 0

    def loaded() -> bool:
        nonlocal seen
        shown = _usage_rules(st, key)
        seen = seen + 1 if shown is not None and rule_ids <= set(shown) else 0
        return seen >= PROPAGATION_CONFIRMATIONS

    return harness.wait_until(loaded, pb.CONFIG_PROPAGATION_TIMEOUT_S, st.meshfast, what)


def _pct(values: list[float], p: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(round(p / 100 * len(ordered) + 0.5)) - 1))]


def server_env() -> dict[str, str]:
    """meshfast runs the working tree, as floor_bench's servers do."""
    return fb.server_env(argparse.Namespace(loop=None))


# --------------------------------------------------------------------------- 1. oversubscription


@dataclass
class Trial:
    name: str
    multiple: int
    rules: list[dict]  # {"id", "scope": "tag"|"first", "threshold_usd", "mode", "window"}
    results: dict = field(default_factory=dict)


def _provision_oversub(st: pb.Stack) -> None:
    """One openai-family provider on testserve; models and people are made per trial."""
    provider = harness.admin_create(st.meshfast_url, st.admin_token, "/admin/providers", {
        "name": "rules-openai", "family": "openai", "base_url": f"{st.testserve_url}/openai",
        "api_key": pb.TESTSERVE_KEY, "local": True, "verify": False, "models": []})
    st.setup["provider_id"] = provider["id"]


def _trial_setup(st: pb.Stack, trial: Trial, n_calls: int, k: int) -> dict:
    tag = f"over-{trial.name}-{k}"
    models = []
    for i in range(2):
        models.append(harness.admin_create(st.meshfast_url, st.admin_token, "/admin/models", {
            "provider_id": st.setup["provider_id"], "name": f"{tag}-m{i}", "resolved_model": "dummy-chat",
            "kind": "chat", "input_price_per_1k_tokens": "0", "output_price_per_1k_tokens": "1", "tags": [tag],
            "verify": False}))
    person = harness.admin_create(st.meshfast_url, st.admin_token, "/admin/users",
                                  {"email": f"{tag}@example.com", "display_name": tag})
    for m in models:
        _admin(st, "POST", "/admin/access", {"user_id": person["id"], "model_id": m["id"]})
        # The grant's default $20 a day must not be the cap that binds; always open.
        _admin(st, "PUT", f"/admin/users/{person['id']}/policies/{m['id']}",
               {**pb.BUDGET_POLICY, "daily_cap_usd": 1000})
    ids = set()
    for rule in trial.rules:
        rule["id"] = f"{tag}-{rule['scope']}"
        scope = {"tag": tag} if rule["scope"] == "tag" else {"model": models[0]["name"]}
        threshold = rule["calls"] * CALL_USD
        rule["threshold_usd"] = str(threshold)
        _admin(st, "POST", "/admin/rules", {
            "id": rule["id"], "weight": rule.get("weight", 10), "mode": rule.get("mode", "enforce"),
            "entries": [{"population": {}, "scope": scope, "window": rule.get("window", "daily"),
                         "threshold_usd": str(threshold), "actions": [{"type": "block"}]}]})
        ids.add(rule["id"])
    propagation_s = _wait_rules(st, person["key"], ids, f"trial {tag}'s rules on every worker")
    return {"tag": tag, "models": models, "person": person, "propagation_s": propagation_s}


async def _burst(url: str, key: str, model_names: list[str], calls: int) -> list[tuple[int, dict]]:
    """`calls` POST /v1/proxy at once, each on its own connection, alternating the models."""
    import httpx

    limits = httpx.Limits(max_connections=calls, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
        async def one(i: int) -> tuple[int, dict]:
            r = await client.post("/v1/proxy", params={"model": model_names[i % len(model_names)]},
                                  headers={"authorization": f"Bearer {key}"},
                                  json={"query": PROMPT, "max_tokens": MAX_TOKENS})
            try:
                body = r.json() if r.status_code != 200 else {}
            except ValueError:
                body = {"raw": r.text[:300]}
            return r.status_code, body

        return await asyncio.gather(*(one(i) for i in range(calls)))


def _one_call(st: pb.Stack, key: str, model: str) -> tuple[int, dict]:
    status, _, raw = harness.http_request("POST", f"{st.meshfast_url}/v1/proxy?model={model}",
                                          {"authorization": f"Bearer {key}"},
                                          {"query": PROMPT, "max_tokens": MAX_TOKENS}, timeout_s=30.0)
    return status, (json.loads(raw) if status != 200 and raw.startswith(b"{") else {})


def _rows(st: pb.Stack, user_id: str, expected_calls: int) -> list[dict]:
    """The person's rows once `expected_calls` calls are in (denials may be folded: `count`)."""
    rows: list[dict] = []

    def all_in() -> bool:
        nonlocal rows
        got, page = [], 1
        while True:
            doc = _admin(st, "GET", f"/admin/logs?user_id={user_id}&page_size=500&page={page}")
            got += doc["logs"]
            if len(got) >= doc["total"] or not doc["logs"]:
                break
            page += 1
        rows = got
        return sum(r.get("count") or 1 for r in rows) >= expected_calls

    harness.wait_until(all_in, 30.0, st.meshfast, f"{expected_calls} rows of {user_id}")
    return rows


def _run_trial(st: pb.Stack, trial: Trial, n_calls: int, k: int) -> dict:
    setup = _trial_setup(st, trial, n_calls, k)
    person, models = setup["person"], setup["models"]
    names = [m["name"] for m in models]
    calls = trial.multiple * n_calls
    harness.http_request("DELETE", st.testserve_url + "/_debug/requests", timeout_s=5.0)
    harness.http_request("POST", st.testserve_url + "/_debug/config", body={"delta_delay_ms": DELTA_DELAY_MS})
    t0 = time.monotonic()
    try:
        answers = asyncio.run(_burst(st.meshfast_url, person["key"], names, calls))
    finally:
        harness.http_request("POST", st.testserve_url + "/_debug/config", body={"delta_delay_ms": 0})
    burst_s = time.monotonic() - t0
    status, _, raw = harness.http_request("GET", st.testserve_url + "/_debug/stats", timeout_s=5.0)
    peak = json.loads(raw).get("peak_in_flight") if status == 200 else None
    statuses: dict[str, int] = {}
    refused_by: dict[str, int] = {}
    for code, body in answers:
        statuses[str(code)] = statuses.get(str(code), 0) + 1
        if code == 429:
            refused_by[str(body.get("rule"))] = refused_by.get(str(body.get("rule")), 0) + 1
    admitted = statuses.get("200", 0)
    # Then one call at a time, alternating the models still answering, until each is refused: every
    # enforcing threshold then fills to exactly its calls, and never past.
    topped_up, total_calls = 0, calls
    open_models = list(names) if any(r.get("mode", "enforce") == "enforce" for r in trial.rules) else []
    # In shadow mode nothing refuses: N more calls one at a time, each judged on settled spend (so marked).
    for i in range(n_calls if not open_models else 0):
        code, _ = _one_call(st, person["key"], names[i % 2])
        total_calls += 1
        topped_up += code == 200
    while open_models and topped_up <= 2 * n_calls:
        model = open_models[(topped_up + total_calls) % len(open_models)]
        code, _ = _one_call(st, person["key"], model)
        total_calls += 1
        if code == 200:
            topped_up += 1
        else:
            open_models.remove(model)
    rows = _rows(st, person["id"], total_calls)
    ok_rows = [r for r in rows if r["status_code"] == 200]
    cost = {m["id"]: Decimal(0) for m in models}
    for r in ok_rows:
        cost[r["model_id"]] += Decimal(str(r["input_cost"])) + Decimal(str(r["output_cost"]))
    shown = _usage_rules(st, person["key"]) or {}
    per_rule = {}
    for rule in trial.rules:
        spent = sum(cost.values(), Decimal(0)) if rule["scope"] == "tag" else cost[models[0]["id"]]
        threshold = Decimal(rule["threshold_usd"])
        usage = shown.get(rule["id"], {})
        per_rule[rule["id"]] = {
            "scope": rule["scope"], "mode": rule.get("mode", "enforce"), "window": rule.get("window", "daily"),
            "threshold_usd": float(threshold), "threshold_calls": rule["calls"],
            "recorded_spend_usd": float(spent), "over_threshold_usd": float(max(Decimal(0), spent - threshold)),
            "filled_exactly": spent == threshold,
            "usage_spend_usd": usage.get("spend_usd"), "usage_status": usage.get("status"),
            "usage_utilization": usage.get("utilization"),
        }
    would_deny = sum(1 for r in rows if r.get("would_deny"))
    return {
        "trial": trial.name, "repeat": k, "multiple": trial.multiple, "calls": calls, "cap_calls": n_calls,
        "burst_s": round(burst_s, 3), "testserve_peak_in_flight": peak, "propagation_s": setup["propagation_s"],
        "statuses": statuses, "admitted": admitted, "refused": sum(refused_by.values()), "refused_by_rule": refused_by,
        "topped_up_after": topped_up, "admitted_total": admitted + topped_up,
        "rows": len(rows), "rows_200": len(ok_rows), "rows_would_deny": would_deny,
        # Overshoot: recorded spend past an enforcing block's threshold (a shadow rule is meant to be passed).
        "rules": per_rule, "max_overshoot_usd": max((r["over_threshold_usd"] for r in per_rule.values()
                                                     if r["mode"] == "enforce"), default=0.0),
    }


def trials_for(args) -> list[Trial]:
    n = args.cap_calls
    out = []
    for k in range(args.repeats):
        for m in args.multiples:
            out.append(Trial(f"one-{m}x", m, [{"scope": "tag", "calls": n}]))
        out.append(Trial("two-4x", 4, [{"scope": "tag", "calls": n, "weight": 10},
                                       {"scope": "first", "calls": max(1, n // 2), "weight": 20,
                                        "window": "weekly"}]))
        out.append(Trial("shadow-4x", 4, [{"scope": "tag", "calls": n, "mode": "shadow"}]))
        del k
    return out


def phase_oversubscription(args, work_dir: Path) -> dict:
    stack = None
    doc: dict = {"cap_calls": args.cap_calls, "call_usd": float(CALL_USD), "multiples": args.multiples,
                 "repeats": args.repeats, "delta_delay_ms": DELTA_DELAY_MS, "trials": []}
    try:
        stack = pb.start_stack(args, work_dir, forwarder=False, provision=_provision_oversub)
        doc["setup"] = stack.setup
        meter = pb.CpuMeter(stack.groups)
        seen: dict[str, int] = {}
        for trial in trials_for(args):
            k = seen[trial.name] = seen.get(trial.name, -1) + 1
            print(f"[rules] oversubscription {trial.name} #{k}: {trial.multiple * args.cap_calls} calls "
                  f"at once, cap {args.cap_calls} calls ...", flush=True)
            res = _run_trial(stack, trial, args.cap_calls, k)
            print(f"[rules]   admitted {res['admitted']} (+{res['topped_up_after']} after), refused {res['refused']}, "
                  f"peak in flight {res['testserve_peak_in_flight']}, overshoot {res['max_overshoot_usd']}", flush=True)
            doc["trials"].append(res)
        doc["cpu"] = meter.stop()
    finally:
        if stack is not None:
            stack.stop_into(doc)
    doc["summary"] = oversub_summary(doc["trials"])
    return doc


def oversub_summary(trials: list[dict]) -> dict:
    out: dict = {}
    for t in trials:
        s = out.setdefault(t["trial"], {"runs": 0, "calls": t["calls"], "cap_calls": t["cap_calls"], "admitted": [],
                                        "refused": [], "admitted_total": [], "fill": [], "max_overshoot_usd": 0.0,
                                        "peak_in_flight": [], "would_deny": []})
        s["runs"] += 1
        s["admitted"].append(t["admitted"])
        s["refused"].append(t["refused"])
        s["admitted_total"].append(t["admitted_total"])
        s["peak_in_flight"].append(t["testserve_peak_in_flight"])
        s["would_deny"].append(t["rows_would_deny"])
        s["fill"].append(min(r["recorded_spend_usd"] / r["threshold_usd"] for r in t["rules"].values()))
        s["max_overshoot_usd"] = max(s["max_overshoot_usd"], t["max_overshoot_usd"])
    return out


# ------------------------------------------------------------------------------ 2. in process


def _gates_module():
    """tests/bench/test_core_gates.py, for its `_rules_config` (the gate's configuration)."""
    path = ROOT / "tests" / "bench" / "test_core_gates.py"
    spec = importlib.util.spec_from_file_location("meshfast_core_gates", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _timed_calls(core, callers: list[tuple[str, str]], body: bytes, now_ms: int, what: str) -> list[int]:
    """One prepare + settle per (authorization, query), each timed (ns); a refusal is an error."""
    ns = []
    for header, query in callers:
        s = time.perf_counter_ns()
        p = core.prepare("proxy", header, None, None, query, body, len(body), now_ms)
        p.settle(1_000, 10)
        ns.append(time.perf_counter_ns() - s)
        if p.status != 0:
            raise BenchError(f"{what}: refused: {p.deny_reason}")
    return ns


def phase_in_process(args) -> dict:
    import msgspec

    from meshfast._core import Core, Segment
    from meshfast.snapshot import encode

    gates = _gates_module()
    gates.RULES_USERS = args.scale_users
    t0 = time.monotonic()
    seg_dir = Path(tempfile.mkdtemp(prefix="meshfast-rules-inproc-"))
    try:
        probe = Core(gates.PEPPER, Segment.create(str(seg_dir / "probe.seg")))
        config, callers = gates._rules_config(probe.hash_token)
        del probe
        generate_s = time.monotonic() - t0
        # The worst case beside the gate's mix: every entry on tag "all" (all 200 models; a person holds
        # 10) and no population filter, so all 200 entries cover every call (the shadow ones reserve nothing).
        all_cover = [msgspec.structs.replace(r, entries=[msgspec.structs.replace(
            e, tag="all", model=None, tiers=[], leaders=[], business_units=[]) for e in r.entries]) for r in config.rules]
        variants = {"rules": config, "no_rules": msgspec.structs.replace(config, rules=[]),
                    "rules_all_cover": msgspec.structs.replace(config, rules=all_cover)}
        cores, out = {}, {"users": len(config.principals), "models": len(config.models), "grants": len(config.grant_table or []),
                          "rules": len(config.rules), "entries": sum(len(r.entries) for r in config.rules),
                          "callers": len(callers), "config_generate_s": round(generate_s, 2), "variants": {}}
        body = b'{"query":"hello there, how are you today?","max_tokens":256}'
        now_ms = int(time.time() * 1000)
        # Every grant of each caller (principal i < len(callers) holds grants[10 i : 10 i + 10]).
        per_user = gates.GRANTS_PER_USER
        records = list(config.grant_table.records()) if config.grant_table is not None else []
        pairs = [(callers[i][0], f"model=m{model}") for i in range(len(callers))
                 for _, model, _ in records[i * per_user:(i + 1) * per_user]]
        for name, cfg in variants.items():
            segment = Segment.create(str(seg_dir / f"{name}.seg"))
            segment.register()
            core = Core(gates.PEPPER, segment)
            data = encode(cfg)
            started = time.perf_counter()
            core.load(data)
            load_s = time.perf_counter() - started
            before = segment.stats()
            for header, query in pairs:
                p = core.prepare("proxy", header, None, None, query, body, len(body), now_ms)
                if p.status != 0:
                    raise BenchError(f"in-process {name}: {query} refused: {p.deny_reason}")
                p.settle(1_000, 10)
            after = segment.stats()
            cores[name] = core
            out["variants"][name] = {
                "load_s": round(load_s, 3), "snapshot_bytes": len(data), "active_pairs": len(pairs),
                "slots_before": before["slots_used"], "slots_after": after["slots_used"],
                "slots_per_active_pair": round((after["slots_used"] - before["slots_used"]) / len(pairs), 2),
                "segment_slots": after["slots"]}
            del data
        samples: dict[str, list[int]] = {n: [] for n in cores}
        block = 500
        gc.disable()
        try:
            for i in range(args.inproc_calls // block):
                for name in (("rules", "no_rules") if i % 2 == 0 else ("no_rules", "rules")):
                    batch = [callers[(i * block + j) % len(callers)] for j in range(block)]
                    samples[name] += _timed_calls(cores[name], batch, body, now_ms, f"in-process {name}")
        finally:
            gc.enable()
        # The worst case, timed apart (it is slower by two orders of magnitude: fewer calls).
        core, acc = cores["rules_all_cover"], samples.setdefault("rules_all_cover", [])
        gc.disable()
        try:
            batch = [callers[j % len(callers)] for j in range(max(500, args.inproc_calls // 10))]
            acc += _timed_calls(core, batch, body, now_ms, "in-process rules_all_cover")
        finally:
            gc.enable()
        for name, ns in samples.items():
            v = out["variants"][name]
            v.update({"calls": len(ns), "median_us": round(statistics.median(ns) / 1000, 3),
                      "p99_us": round(_pct(ns, 99) / 1000, 3), "mean_us": round(statistics.fmean(ns) / 1000, 3),
                      "min_us": round(min(ns) / 1000, 3)})
        r, n0 = out["variants"]["rules"], out["variants"]["no_rules"]
        out["rules_add_median_us"] = round(r["median_us"] - n0["median_us"], 3)
        out["goal_median_us"] = GOAL_DECISION_US
        out["goal_met"] = r["median_us"] <= GOAL_DECISION_US
        w = out["variants"]["rules_all_cover"]
        w["covering_entries"] = out["entries"]
        w["us_per_covering_entry"] = round((w["median_us"] - n0["median_us"]) / out["entries"], 3)
        out["worst_case_goal_met"] = w["median_us"] <= GOAL_DECISION_US
        return out
    finally:
        shutil.rmtree(seg_dir, ignore_errors=True)


def phase_instructions() -> dict:
    from bench import instructions as ins

    binary = ins.build()
    total = ins.count(binary, "rule_decision")
    return {"workload": "rule_decision", "toggle_collect": ins.TOGGLE_COLLECT["rule_decision"],
            "decisions": RULE_DECISION_CALLS, "instructions": total,
            "per_decision": round(total / RULE_DECISION_CALLS, 1),
            "baseline_per_decision": round(json.loads(ins.BASELINE.read_text())["instructions"]["rule_decision"]
                                           / RULE_DECISION_CALLS, 1),
            "what": ("rules::decide and what it calls (populations, scopes, pool reservations, committed counters "
                     "read) for 10,000 decisions on 100 rules x 2 entries, 2,000 people, 200 models; then each "
                     "lease released (outside the count)")}


# ------------------------------------------------------------------------------------ 3. proxy


@dataclass
class ProxySides:
    """nginx and two gateways of the same build: what floor_bench's phases need (groups, servers, secrets)."""

    upstream: Server
    upstream_url: str
    sides: dict[str, pb.Stack]
    groups: pb.Groups = field(default_factory=pb.Groups)
    setup: dict = field(default_factory=dict)

    def servers(self) -> list[Server]:
        return [self.upstream, *(s.meshfast for s in self.sides.values())]

    def secrets(self) -> list[str]:
        return [x for s in self.sides.values() for x in s.secrets()]

    def check_alive(self) -> None:
        for s in self.servers():
            s.check_alive()

    def stop_into(self, doc: dict) -> None:
        doc["server_log_tails"] = {s.name: harness.redact([s.log_tail(3000)], self.secrets())[0] for s in self.servers()}
        doc["stop"] = {name: side.stop() for name, side in self.sides.items()}
        doc["stop"]["upstream"] = self.upstream.stop()


def start_proxy_sides(args, work_dir: Path) -> ProxySides:
    env = server_env()
    port = harness.free_port()
    conf = work_dir / "nginx.conf"
    conf.write_text(fb.nginx_conf(work_dir, port, 1))
    upstream = harness.nginx_server(work_dir, conf, env)
    ps = ProxySides(upstream=upstream, upstream_url=f"http://127.0.0.1:{port}", sides={})
    import secrets as _secrets

    for name in ("meshfast-norules", "meshfast-rules"):
        st = pb.Stack()
        st.meshfast_url = f"http://127.0.0.1:{harness.free_port()}"
        st.data_dir = tempfile.mkdtemp(prefix=f"{name}-")
        st.admin_token = _secrets.token_urlsafe(32)
        mf_env = dict(env, MESHFAST_DATA_DIR=st.data_dir, MESHFAST_ADMIN_TOKEN=st.admin_token)
        mf_env.pop("DATABASE_URL", None)
        st.meshfast = Server(name, shlex.split(args.meshfast_cmd) + [
            "serve", "--workers", str(args.workers), "--host", "127.0.0.1", "--port", st.meshfast_url.rsplit(":", 1)[1]],
            mf_env, work_dir / f"{name}.log")
        ps.sides[name] = st
    try:
        for s in ps.servers():
            s.start()
            ps.groups.sessions[s.name] = s.proc.pid
        for name, st in ps.sides.items():
            ps.groups.data_dirs[f"{name}_postgres"] = st.data_dir
        ps.setup["upstream_ready_s"] = harness.wait_until(lambda: fb._answers(ps.upstream_url + "/healthz"), 30.0, upstream,
                                                          "an answer")
        for name, st in ps.sides.items():
            ps.setup[f"{name}_ready_s"] = harness.wait_until(
                lambda st=st: harness.http_request("GET", st.meshfast_url + "/readyz", timeout_s=2.0)[0] == 200,
                pb.MESHFAST_READY_TIMEOUT_S, st.meshfast, "GET /readyz == 200")
            fs = fb.FloorStack(meshfast=st.meshfast, meshfast_url=st.meshfast_url, admin_token=st.admin_token,
                               urls={"upstream": ps.upstream_url})
            fb.provision(fs)  # one provider, model and governed user: floor_bench's own setup
            st.user_key, st.user_id, st.setup = fs.user_key, fs.user_id, fs.setup
        ps.setup["rules"] = load_rules(args, ps.sides["meshfast-rules"])
    except BaseException:
        ps.stop_into({})
        raise
    return ps


def load_rules(args, st: pb.Stack) -> dict:
    """`--extra-users` people in a reporting tree (business units, tiers), the bench user placed in it, and
    `--rules` rules of 2 entries on the called model; until every worker shows them to the bench user."""
    t0 = time.monotonic()
    tiers, units = ("normal", "senior", "exec"), [f"bu{i}" for i in range(20)]
    users = []
    for i in range(args.extra_users):
        body = {"email": f"org{i}@example.com", "display_name": f"Org {i}", "business_unit": units[i % len(units)],
                "tier": tiers[i % 3]}
        if i >= 10:
            body["manager_email"] = f"org{(i * 7919) % i}@example.com"
        users.append(harness.admin_create(st.meshfast_url, st.admin_token, "/admin/users", body))
    users_s = time.monotonic() - t0
    # The bench user reports to the last person, so the chain above it has several leaders.
    status, headers, raw = harness.http_request("GET", f"{st.meshfast_url}/admin/users/{st.user_id}",
                                                {"authorization": f"Bearer {st.admin_token}"}, timeout_s=10.0)
    etag = {k.lower(): v for k, v in headers.items()}.get("etag")
    status, _, raw = harness.http_request(
        "PUT", f"{st.meshfast_url}/admin/users/{st.user_id}",
        {"authorization": f"Bearer {st.admin_token}", "if-match": etag or "*"},
        {"manager_email": users[-1]["email"] if users else None, "business_unit": "bu0", "tier": "normal"},
        timeout_s=30.0)
    if status != 200:
        raise BenchError(f"PUT /admin/users/{st.user_id} answered {status}: {raw[:300]!r}")
    rule_ids = []
    t1 = time.monotonic()
    for r in range(args.rules):
        entries = []
        for e in range(2):
            population: dict = {}
            if r % 2:
                population["tiers"] = [tiers[r % 3]]
            if r % 4 == 0 and users:
                population["leaders"] = [users[(r * 7) % len(users)]["id"]]
            if r % 5 == 0:
                population["business_units"] = [units[r % len(units)]]
            window = ("daily", "weekly", "monthly")[(r + e) % 3]
            entries.append({"population": population, "scope": {"model": fb.MODEL}, "window": window,
                            # Far above any spend here; daily <= weekly <= monthly, as validation wants.
                            "threshold_usd": str({"daily": 1, "weekly": 7, "monthly": 31}[window] * 1_000_000 + r),
                            "actions": [{"type": "block"}, {"type": "warn", "text": "near the cap"}]})
        rule_id = f"bench-{r:03d}"
        _admin(st, "POST", "/admin/rules", {"id": rule_id, "weight": r, "mode": "shadow" if r % 7 == 0 else "enforce",
                                            "entries": entries})
        rule_ids.append(rule_id)
    rules_s = time.monotonic() - t1
    # The rules the bench user is governed by (its population) must be on every worker before measuring.
    expected: set[str] = set()

    def stable() -> bool:
        nonlocal expected
        shown = _usage_rules(st, st.user_key)
        if shown is None:
            return False
        expected = set(shown)
        return bool(expected) or not args.rules

    harness.wait_until(stable, pb.CONFIG_PROPAGATION_TIMEOUT_S, st.meshfast, "the rules in /v1/usage")
    time.sleep(1.5)  # NOTE: the last rule's NOTIFY reaches the workers within a second
    shown = _usage_rules(st, st.user_key) or {}
    propagation_s = _wait_rules(st, st.user_key, set(shown), "the bench user's rules on every worker")
    return {"extra_users": len(users), "rules": len(rule_ids), "entries": 2 * len(rule_ids),
            "scope": f"model {fb.MODEL} (every entry covers the called model)",
            "rules_governing_bench_user": len(shown), "users_s": round(users_s, 2), "rules_s": round(rules_s, 2),
            "propagation_s": propagation_s, "bench_user": {"tier": "normal", "business_unit": "bu0",
                                                           "manager": users[-1]["email"] if users else None}}


def phase_proxy(args, work_dir: Path) -> dict:
    doc: dict = {}
    ps = None
    try:
        ps = start_proxy_sides(args, work_dir)
        doc["setup"] = ps.setup
        doc["servers"] = {s.name: shlex.join(harness.redact(s.argv, ps.secrets())) for s in ps.servers()}
        up_auth = {"authorization": f"Bearer {fb.UPSTREAM_KEY}", "content-type": "application/json"}
        targets = {"direct": loadgen.Target.post("direct", f"{ps.upstream_url}/sse/v1/chat/completions", up_auth,
                                                 fb.STREAM_REQUEST % fb.RESOLVED.encode(), fb.SSE_END)}
        for name, st in ps.sides.items():
            targets[name] = loadgen.Target.post(name, f"{st.meshfast_url}/v1/proxy?model={fb.MODEL}",
                                                {"authorization": f"Bearer {st.user_key}",
                                                 "content-type": "application/json"}, pb.PROXY_BODY, pb.NDJSON_END)
        for t in targets.values():
            pb._exchange_once(t)
        # CPU of each gateway (workers + its PostgreSQL) with no load: background work that rules might add.
        time.sleep(1.0)
        meter = pb.CpuMeter(ps.groups)
        time.sleep(args.idle_s)
        doc["idle_cpu"] = meter.stop()
        before = {name: pb.metrics_at(st.meshfast_url, st.admin_token) for name, st in ps.sides.items()}
        print(f"[rules] proxy, one connection: {args.b2b_rounds} x {args.b2b_duration:g} s x {len(targets)} ...",
              flush=True)
        doc["back_to_back"] = fb.phase_back_to_back(args, ps, targets)
        # Where each gateway's admitted calls spent their time (meshfast's phase histograms): receive,
        # gateway (authentication to the upstream send: the decision's share), upstream.
        mid = {name: pb.metrics_at(st.meshfast_url, st.admin_token) for name, st in ps.sides.items()}
        doc["phase_split_back_to_back"] = {name: pb.phase_split(before[name], mid[name]) for name in ps.sides}
        # wrk rounds alternate the two gateways' order (direct first, then A B, then B A, ...).
        rounds = []
        for r in range(args.wrk_rounds):
            order = ["direct"] if r == 0 else []
            order += ["meshfast-norules", "meshfast-rules"][::1 if r % 2 == 0 else -1]
            rounds.append(fb.phase_wrk(args, ps, {n: targets[n] for n in order}, work_dir))
        doc["throughput"] = merge_wrk_rounds(rounds)
        end = {name: pb.metrics_at(st.meshfast_url, st.admin_token) for name, st in ps.sides.items()}
        doc["phase_split_wrk"] = {name: pb.phase_split(mid[name], end[name]) for name in ps.sides}
        doc["telemetry"] = {name: pb.settled_telemetry(st.meshfast_url, st.admin_token)
                            for name, st in ps.sides.items()}
        # The rules side still governs by its rules after the load (what /v1/usage shows the bench user).
        doc["rules_after"] = len(_usage_rules(ps.sides["meshfast-rules"], ps.sides["meshfast-rules"].user_key) or {})
    finally:
        if ps is not None:
            ps.stop_into(doc)
    doc["summary"] = proxy_summary(doc)
    return doc


def merge_wrk_rounds(rounds: list[dict]) -> dict:
    """floor_bench's wrk phase, once per round: each target's runs, and their mean req/s and CPU per call."""
    merged = {k: v for k, v in rounds[0].items() if k != "runs"}
    merged["rounds"] = len(rounds)
    runs: dict[str, dict] = {}
    for rnd in rounds:
        for name, run in rnd["runs"].items():
            runs.setdefault(name, {"rounds": []})["rounds"].append(run)
    for r in runs.values():
        per = r["rounds"]
        r["wrk"] = {"errors": {k: sum(x["wrk"]["errors"].get(k, 0) for x in per) for k in per[0]["wrk"]["errors"]},
                    "requests": sum(x["wrk"]["requests"] for x in per)}
        r["requests_per_s"] = round(statistics.fmean(x["requests_per_s"] for x in per), 1)
        cpu = [x["worker_cpu_us_per_call"] for x in per if x.get("worker_cpu_us_per_call") is not None]
        r["worker_cpu_us_per_call"] = round(statistics.fmean(cpu), 1) if cpu else None
        r["requests_per_s_rounds"] = [x["requests_per_s"] for x in per]
    merged["runs"] = runs
    return merged


def proxy_summary(doc: dict) -> dict:
    b2b = (doc.get("back_to_back") or {}).get("targets", {})
    wrk = (doc.get("throughput") or {}).get("runs", {})
    rows = {}
    for name in ("direct", "meshfast-norules", "meshfast-rules"):
        row: dict = {}
        rep = b2b.get(name)
        if rep:
            row.update({"p50_us": rep["total_us"].get("p50"), "p99_us": rep["total_us"].get("p99"),
                        "added_p50_us": rep.get("added_us", {}).get("p50"),
                        "added_p99_us": rep.get("added_us", {}).get("p99")})
        if name in wrk:
            row["rps"] = wrk[name]["requests_per_s"]
            row["worker_cpu_us_per_call"] = wrk[name]["worker_cpu_us_per_call"]
        rows[name] = row
    for name in ("meshfast-norules", "meshfast-rules"):
        split = (doc.get("phase_split_back_to_back") or {}).get(name) or {}
        for phase in ("receive", "gateway", "upstream"):
            if split.get(phase):
                rows[name][f"{phase}_p50_us"] = split[phase].get("p50")
                rows[name][f"{phase}_mean_us"] = split[phase].get("mean_us")
        idle = (doc.get("idle_cpu") or {}).get("cpu_s") or {}
        wall = (doc.get("idle_cpu") or {}).get("wall_s")
        if wall:
            rows[name]["idle_cpu_pct"] = round(100 * (idle.get(name, 0) + idle.get(f"{name}_postgres", 0)) / wall, 1)
    a, b = rows.get("meshfast-norules", {}), rows.get("meshfast-rules", {})
    delta = {}
    for k in ("added_p50_us", "added_p99_us", "rps", "worker_cpu_us_per_call", "gateway_p50_us", "gateway_mean_us",
              "idle_cpu_pct"):
        if a.get(k) is not None and b.get(k) is not None:
            delta[k] = round(b[k] - a[k], 1)
    if a.get("rps") and b.get("rps"):
        delta["rps_ratio"] = round(b["rps"] / a["rps"], 3)
    return {"targets": rows, "rules_minus_norules": delta}


# -------------------------------------------------------------------------------------- 4. shm


def _decision_times(core, callers: list[tuple[str, str]], body: bytes, now_ms: int) -> dict:
    gc.disable()
    try:
        ns = _timed_calls(core, callers, body, now_ms, "shm")
    finally:
        gc.enable()
    return {"calls": len(ns), "median_us": round(statistics.median(ns) / 1000, 2),
            "p99_us": round(_pct(ns, 99) / 1000, 2)}


def phase_shm(args) -> dict:
    """Every person x model pair of the in-process config makes a call, then the leader's checkpoint
    gives each moved counter its shadow: the segment's size and occupancy at that many active pairs
    (MESHFAST_SHM_SLOTS sized as the settings' help says), and one call's decision there, for callers
    spread over all pairs (the table and snapshot far larger than the caches) and for a few hot ones."""
    from meshfast import counters
    from meshfast._core import Core, Segment, counter_key
    from meshfast.settings import Settings
    from meshfast.snapshot import encode

    gates = _gates_module()
    gates.RULES_USERS = args.scale_users
    active_pairs = args.scale_users * gates.GRANTS_PER_USER
    slots = round(active_pairs * SHM_SLOTS_PER_PAIR)
    # What meshfast/supervisor.py creates with the settings in this environment (defaults when unset).
    settings = Settings.from_env()
    defaults = {"shm_slots": settings.shm_slots, "telemetry_ring_rows": settings.telemetry_ring_rows}
    mib = 1024 * 1024
    out: dict = {"goal_mib": GOAL_SHM_MB, "slot_bytes": SLOT_BYTES, "active_pairs": active_pairs,
                 "slots_per_pair_sized": SHM_SLOTS_PER_PAIR, "scale": "full" if active_pairs >= ACTIVE_PAIRS_GOAL else
                 "reduced"}
    with tempfile.TemporaryDirectory(prefix="meshfast-shm-") as tmp:
        path = Path(tmp) / "default.seg"
        seg = Segment.create(str(path), slots=int(defaults["shm_slots"]), ring_records=int(defaults["telemetry_ring_rows"]))
        stats = seg.stats()
        size = path.stat().st_size
        del seg
        out["default_segment"] = {"bytes": size, "mib": round(size / mib, 2), "slots": stats["slots"],
                                  "leases": stats["leases"], "procs": stats["procs"],
                                  "ring_records": stats["ring_records"], "record_bytes": stats["record_bytes"],
                                  "fixed_mib": round((size - stats["slots"] * SLOT_BYTES) / mib, 2)}

        path = Path(tmp) / "active.seg"
        segment = Segment.create(str(path), slots=slots, ring_records=int(defaults["telemetry_ring_rows"]))
        segment.register()
        core = Core(gates.PEPPER, segment)
        t0 = time.monotonic()
        config, callers = gates._rules_config(core.hash_token, keyed=args.scale_users, every_grant=True)
        out["config_generate_s"] = round(time.monotonic() - t0, 1)
        core.load(encode(config))
        body = b'{"query":"hello there, how are you today?","max_tokens":256}'
        now_ms = int(time.time() * 1000)
        spread = callers[7::max(1, len(callers) // 10_000)]
        out["decision_empty_table"] = _decision_times(core, spread, body, now_ms)
        t0 = time.monotonic()
        _decision_times(core, callers, body, now_ms)
        out["first_calls_s"] = round(time.monotonic() - t0, 1)
        pairs, providers = counters._periods_of(config, now_ms)
        moved = core.counter_deltas(pairs, providers)
        for kind, a, b, period, delta in moved:
            segment.add_shadow(counter_key(kind, a, b, period), delta)
        if core.counter_deltas(pairs, providers):
            raise BenchError("shm: counters still moved after the checkpoint")
        stats = segment.stats()
        size = path.stat().st_size
        out["checkpointed_counters"] = len(moved)
        out["active"] = {"slots": stats["slots"], "slots_used": stats["slots_used"],
                         "load": round(stats["slots_used"] / stats["slots"], 4),
                         "slots_per_active_pair": round(stats["slots_used"] / active_pairs, 2),
                         "segment_bytes": size, "segment_mib": round(size / mib, 1),
                         "segment_mb": round(size / 1e6, 1)}
        out["decision_spread"] = _decision_times(core, spread, body, now_ms)
        out["decision_hot"] = _decision_times(core, callers[:2000:10] * 50, body, now_ms)
        out["within_goal"] = size / mib <= GOAL_SHM_MB
        del core, segment
    out["note"] = ("The slot table takes any size (MESHFAST_SHM_SLOTS); a counter's checkpoint shadow lives in its "
                   "own slot. decision_spread: callers spread evenly over every active pair, so nearly each read of "
                   "the table and the snapshot misses the caches; decision_hot: 200 callers, as the in-process gate "
                   "measures it. A full table refuses calls (ShmFull: fail closed).")
    return out


# ------------------------------------------------------------------------------------ 4b. start

START_LINE = re.compile(r"start: worker \d+ ready .*?; json (\{.*\})$")


def _bulk_org(url: str, users: int, model_ids: list[str], grants_per_user: int) -> None:
    """People in a reporting tree with business units, tiers and keys, each granted
    ``grants_per_user`` models, and every pair active: spend today (UTC and calendar day) and calls
    this hour. Straight into PostgreSQL (the next start reads it)."""
    import asyncpg

    async def load() -> None:
        conn = await asyncpg.connect(url)
        try:
            await conn.execute(f"""
                INSERT INTO users (email, display_name, business_unit, tier)
                SELECT 'start' || g || '@example.com', 'Start ' || g, 'bu' || (g % 50),
                       (ARRAY['normal', 'senior', 'exec'])[1 + g % 3]
                FROM generate_series(1, {users}) g""")
            await conn.execute("""
                WITH o AS (SELECT id, row_number() OVER (ORDER BY email) AS n FROM users WHERE email LIKE 'start%')
                UPDATE users u SET manager_id = m.id FROM o, o m
                WHERE u.id = o.id AND o.n > 10 AND m.n = 1 + (o.n * 7919) % (o.n - 1)""")
            await conn.execute("""
                INSERT INTO mesh_api_keys (user_id, key_hash, key_prefix)
                SELECT id, sha256(convert_to(id::text, 'UTF8')), 'mesh_live_st' FROM users WHERE email LIKE 'start%'""")
            await conn.execute(f"""
                INSERT INTO user_model_access (user_id, model_id)
                SELECT u.id, ($1::uuid[])[1 + (u.n * 7 + k * 13) % array_length($1::uuid[], 1)]
                FROM (SELECT id, row_number() OVER (ORDER BY email) AS n FROM users WHERE email LIKE 'start%') u
                CROSS JOIN generate_series(0, {grants_per_user - 1}) k""", model_ids)
            pairs = "SELECT a.user_id, a.model_id FROM user_model_access a JOIN users u ON u.id = a.user_id " \
                    "WHERE u.email LIKE 'start%'"
            await conn.execute(f"INSERT INTO daily_spend SELECT user_id, model_id, current_date, 1000000 FROM ({pairs}) p")
            await conn.execute(f"INSERT INTO calendar_spend SELECT user_id, model_id, current_date, 1000000 FROM ({pairs}) p")
            await conn.execute(f"""INSERT INTO user_model_hourly_usage
                SELECT user_id, model_id, date_trunc('hour', now()), 1 FROM ({pairs}) p""")
            await conn.execute("ANALYZE")
        finally:
            await conn.close()

    asyncio.run(load())


def phase_start(args, work: Path) -> dict:
    """The gateway's own start with the in-process config's scale in PostgreSQL (people with keys,
    10 grants each, every pair active, 100 rules): `meshfast serve --workers W` restarted, and each
    worker's start clock (meshfast/startclock.py) read from the log: the time from the process's
    start to the last worker's readiness, split into the database's part and meshfast's own."""
    sys.path.insert(0, str(ROOT / "tests"))
    from conftest import Gateway

    users = args.scale_users
    pairs = users * 10
    env = {"MESHFAST_SHM_SLOTS": str(max(1 << 20, round(pairs * SHM_SLOTS_PER_PAIR)))}
    gw = Gateway(work / "start-data", workers=args.workers, env=env)
    out: dict = {"users": users, "grants": pairs, "active_pairs": pairs, "workers": args.workers,
                 "shm_slots": int(env["MESHFAST_SHM_SLOTS"]), "goal_s": 2.0}
    try:
        gw.start(timeout_s=180)
        provider = gw.create_provider("start-provider")
        models = [gw.create_model(provider["id"], f"start-m{i}", tags=[f"fam{i % 20}", "all"])["id"]
                  for i in range(200)]
        for r in range(args.rules):
            response = gw.admin("POST", "/admin/rules", {
                "id": f"start-rule-{r}", "weight": r, "mode": "shadow" if r % 7 == 0 else "enforce",
                "entries": [{"population": {"tiers": [("normal", "senior", "exec")[r % 3]]} if r % 2 else {},
                             "scope": {"tag": "all" if r % 10 == 0 else f"fam{r % 20}"},
                             "window": ("daily", "weekly", "monthly")[(r + e) % 3],
                             "threshold_usd": str((1000, 5000, 20000)[(r + e) % 3] + r),
                             "actions": [{"type": "block"}]}
                            for e in range(2)]})
            if response.status_code != 201:
                raise BenchError(f"rule {r}: {response.status_code} {response.text[:300]}")
        t0 = time.monotonic()
        _bulk_org(gw.database_url, users, models, 10)
        out["bulk_load_s"] = round(time.monotonic() - t0, 1)
        gw.stop()
        runs = []
        for _ in range(args.start_runs):
            mark = gw.log_path.stat().st_size
            t0 = time.monotonic()
            gw.start(timeout_s=300)
            outside_s = time.monotonic() - t0
            deadline = time.monotonic() + 30
            while True:
                with open(gw.log_path, "rb") as f:
                    f.seek(mark)
                    lines = f.read().decode(errors="replace").splitlines()
                ready = [json.loads(m.group(1)) for line in lines if (m := START_LINE.search(line))]
                if len(ready) >= args.workers or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            if len(ready) < args.workers:
                raise BenchError(f"start: {len(ready)} worker start lines in the log, expected {args.workers}")
            last = max(ready, key=lambda r: r["total_s"])
            runs.append({"total_s": last["total_s"], "database_s": last["database_s"], "own_s": last["own_s"],
                         "ready_seen_from_outside_s": round(outside_s, 2), "phases": last["phases"],
                         "workers": [{k: r[k] for k in ("total_s", "database_s", "own_s")} for r in ready]})
            gw.stop()
        out["runs"] = runs
        best = min(runs, key=lambda r: r["own_s"])
        out["own_s_median"] = round(statistics.median(r["own_s"] for r in runs), 3)
        out["own_s_best"] = best["own_s"]
        out["total_s_median"] = round(statistics.median(r["total_s"] for r in runs), 3)
        out["database_s_median"] = round(statistics.median(r["database_s"] for r in runs), 3)
        out["within_goal"] = out["own_s_median"] <= out["goal_s"]
    finally:
        gw.stop()
    out["note"] = ("own_s: from the serve process's start (the kernel's record) to the last worker's readiness, minus "
                   "the phases spent waiting on PostgreSQL (starting the embedded server, migrations, the counter "
                   "seed's queries, registration, each worker's pools and snapshot read). The workers start "
                   "together and share the machine's CPUs.")
    return out


# ----------------------------------------------------------------------------- 5. propagation


def phase_propagation() -> dict:
    argv = [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "tests/test_rules_scale.py"]
    env = dict(os.environ, PYTHONSAFEPATH="1")
    t0 = time.monotonic()
    run = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    out = {"command": shlex.join(argv), "rc": run.returncode, "seconds": round(time.monotonic() - t0, 1),
           "grants": 500_000, "workers": 2}
    match = SCALE_LINE.search(run.stdout)
    if match:
        out.update({"full_rebuild_s": float(match.group(1)), "reorg_ms": int(match.group(2)),
                    "new_rule_ms": int(match.group(3))})
    else:
        out["output_tail"] = (run.stdout + run.stderr)[-3000:]
    return out


# -------------------------------------------------------------------------------------- report


def problems_of(doc: dict) -> list[str]:
    problems = []
    over = doc.get("oversubscription") or {}
    for t in over.get("trials", []):
        bad = {k: v for k, v in t["statuses"].items() if k not in ("200", "429")}
        if bad:
            problems.append(f"oversubscription {t['trial']} #{t['repeat']}: unexpected answers {bad}")
        if t["max_overshoot_usd"] > 0:
            problems.append(f"oversubscription {t['trial']} #{t['repeat']}: OVERSHOOT {t['max_overshoot_usd']} USD")
        shadow = all(r["mode"] == "shadow" for r in t["rules"].values())
        if shadow and t["refused"]:
            problems.append(f"oversubscription {t['trial']} #{t['repeat']}: shadow mode refused {t['refused']}")
        # A rule over both models (scope tag) that fills first blocks everything after it: a rule on
        # one of them may then stay short of its threshold, which is right (no call may pass).
        wider_full = any(r["mode"] == "enforce" and r["scope"] == "tag" and r["filled_exactly"]
                         for r in t["rules"].values())
        for rule_id, r in t["rules"].items():
            if r["mode"] == "enforce" and not r["filled_exactly"] and not (r["scope"] != "tag" and wider_full):
                problems.append(f"oversubscription {t['trial']} #{t['repeat']}: {rule_id} recorded "
                                f"{r['recorded_spend_usd']} USD after topping up, not its threshold {r['threshold_usd']}")
    prop = doc.get("propagation")
    if prop and prop.get("rc") != 0:
        problems.append(f"propagation: tests/test_rules_scale.py exited {prop.get('rc')}")
    proxy = doc.get("proxy") or {}
    problems += pb.problems_of(proxy, ("back_to_back",)) if proxy.get("back_to_back") else []
    return problems


def _f(x) -> str:
    return harness.format_number(x, 2)


def print_tables(doc: dict) -> None:
    over = (doc.get("oversubscription") or {}).get("summary")
    if over:
        print("\nOversubscription (one person, two models of the scope, calls at once):")
        print(f"{'trial':<12}{'runs':>5}{'calls':>7}{'cap':>5}  {'admitted':>14}{'refused':>16}{'filled':>14}"
              f"{'overshoot $':>13}{'peak':>10}")
        for name, s in over.items():
            print(f"{name:<12}{s['runs']:>5}{s['calls']:>7}{s['cap_calls']:>5}  {str(s['admitted']):>14}"
                  f"{str(s['refused']):>16}{str(s['admitted_total']):>14}{s['max_overshoot_usd']:>13}"
                  f"{str(s['peak_in_flight']):>10}")
    ip = doc.get("in_process")
    if ip:
        print(f"\nIn process ({ip['users']:,} people, {ip['models']} models, {ip['grants']:,} grants):")
        for name, v in ip["variants"].items():
            print(f"  {name:<9} prepare+settle median {v['median_us']} us, p99 {v['p99_us']} us "
                  f"({v['calls']:,} calls); load {v['load_s']} s; {v['slots_per_active_pair']} slots per active pair")
    ins = doc.get("instructions")
    if ins and "per_decision" in ins:
        print(f"  rules::decide: {ins['per_decision']:,.0f} instructions per decision (baseline "
              f"{ins['baseline_per_decision']:,.0f})")
    px = (doc.get("proxy") or {}).get("summary")
    if px:
        print("\nProxy path, side by side (us; added = target - direct at one connection; req/s at wrk):")
        for name, r in px["targets"].items():
            print(f"  {name:<18} p50 {_f(r.get('p50_us'))} (+{_f(r.get('added_p50_us'))})  p99 {_f(r.get('p99_us'))} "
                  f"(+{_f(r.get('added_p99_us'))})  req/s {_f(r.get('rps'))}  cpu/call {_f(r.get('worker_cpu_us_per_call'))}")
        for name in ("meshfast-norules", "meshfast-rules"):
            r = px["targets"][name]
            print(f"  {name:<18} gateway phase p50 {_f(r.get('gateway_p50_us'))} mean {_f(r.get('gateway_mean_us'))}; "
                  f"receive p50 {_f(r.get('receive_p50_us'))}; upstream p50 {_f(r.get('upstream_p50_us'))}; "
                  f"idle CPU {_f(r.get('idle_cpu_pct'))}%")
        print(f"  rules - no rules: {px['rules_minus_norules']}")
    shm = doc.get("shm")
    if shm and "active" in shm:
        d, a = shm["default_segment"], shm["active"]
        print(f"\nShared memory: default segment {d['mib']} MiB ({d['slots']:,} slots); {shm['active_pairs']:,} active "
              f"pairs in {a['slots']:,} slots: {a['segment_mib']} MiB ({a['segment_mb']} MB), load {a['load']:.1%}, "
              f"{a['slots_per_active_pair']} slots/pair ({'within' if shm['within_goal'] else 'OVER'} "
              f"{shm['goal_mib']} MiB)")
        for k in ("decision_empty_table", "decision_spread", "decision_hot"):
            print(f"  {k}: median {shm[k]['median_us']} us, p99 {shm[k]['p99_us']} us over {shm[k]['calls']:,} calls")
    start = doc.get("start")
    if start and start.get("runs"):
        print(f"\nStart ({start['users']:,} people, {start['grants']:,} grants, all active, {start['workers']} workers): "
              f"ready {start['total_s_median']} s after the process began, database {start['database_s_median']} s, "
              f"meshfast's own {start['own_s_median']} s (goal {start['goal_s']} s; median of {len(start['runs'])})")
        for phase in min(start["runs"], key=lambda r: r["own_s"])["phases"]:
            print(f"  {phase['name']:<26} {phase['s']:.3f} s{'  (database)' if phase['database'] else ''}")
    prop = doc.get("propagation")
    if prop and "reorg_ms" in prop:
        print(f"\nPropagation (500,000 grants): full rebuild {prop['full_rebuild_s']} s, reorg {prop['reorg_ms']} ms, "
              f"new rule {prop['new_rule_ms']} ms")


# ---------------------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=2, help="Granian workers of every gateway")
    p.add_argument("--cap-calls", type=int, default=25, help="N: calls a threshold admits")
    p.add_argument("--multiples", default="4,10", help="calls at once, as multiples of N")
    p.add_argument("--repeats", type=int, default=3, help="times each oversubscription trial runs")
    p.add_argument("--scale-users", type=int, default=100_000, help="people of the in-process config (10 grants each)")
    p.add_argument("--inproc-calls", type=int, default=40_000, help="timed calls per in-process variant")
    p.add_argument("--extra-users", type=int, default=1000, help="people added to the rules gateway")
    p.add_argument("--rules", type=int, default=100, help="rules (2 entries each) on the rules gateway")
    p.add_argument("--b2b-duration", type=float, default=3.0, help="back-to-back seconds per target per round")
    p.add_argument("--b2b-rounds", type=int, default=4, help="back-to-back rounds (targets alternate)")
    p.add_argument("--connections", type=int, default=64, help="wrk connections")
    p.add_argument("--threads", type=int, default=1, help="wrk threads")
    p.add_argument("--wrk-duration", type=int, default=10, help="measured wrk seconds per target")
    p.add_argument("--wrk-warmup", type=int, default=2, help="wrk seconds before each, kept apart")
    p.add_argument("--wrk-rounds", type=int, default=2, help="wrk rounds (the gateways' order alternates)")
    p.add_argument("--idle-s", type=float, default=5.0, help="seconds of no load: each gateway's background CPU")
    p.add_argument("--start-runs", type=int, default=3, help="restarts timed in the start phase")
    p.add_argument("--skip", action="append", default=[], choices=PHASES, help="leave a phase out (repeatable)")
    p.add_argument("--quick", action="store_true",
                   help="smoke check (~1 min): N=5, one repeat, 10,000 people in process, 20 rules and 100 "
                        "people on the proxy side, 1 x 1 s back to back, wrk 1 + 2 s, no instructions or "
                        "propagation (CI runs both as tests)")
    p.add_argument("--meshfast-cmd", default=harness.default_meshfast_cmd(fallback=False),
                   help="command that takes `serve ...` (meshfast is imported from the working tree)")
    p.add_argument("--out", type=Path, help="result JSON (default bench/results/rules-<timestamp>.json)")
    args = p.parse_args(argv)
    args.multiples = [int(x) for x in str(args.multiples).split(",") if x]
    if args.quick:
        args.cap_calls, args.repeats, args.scale_users, args.inproc_calls = 5, 1, 10_000, 6_000
        args.extra_users, args.rules = 100, 20
        args.b2b_rounds, args.b2b_duration, args.wrk_duration, args.wrk_warmup, args.wrk_rounds = 1, 1.0, 2, 1, 1
        args.idle_s, args.start_runs = 1.0, 1
        args.skip = sorted(set(args.skip) | {"instructions", "propagation"})
    args.only = None  # models_bench.provenance() reads it
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = dt.datetime.now(dt.UTC)
    out_path = args.out or RESULTS_DIR / f"rules-{started.strftime('%Y%m%dT%H%M%SZ')}{'-quick' if args.quick else ''}.json"
    # The gateways this script starts (pb.start_stack too) import meshfast from the working tree.
    os.environ.update({k: v for k, v in server_env().items() if k in ("PYTHONPATH", "PYTHONSAFEPATH")})
    doc: dict = {
        "benchmark": "rules",
        "description": ("spend rules: no overshoot under oversubscription, decision cost in process and in "
                        "instructions, proxy added latency with and without 100 rules, shared-memory size, "
                        "change propagation"),
        **harness.run_header(argv, started, fb.provenance(argparse.Namespace(**{**vars(args), "loop": None,
                                                                                "forwarder_rs": fb.FORWARDER_RS}))),
        "config": {k: v for k, v in vars(args).items() if k not in ("out", "only")},
        "note": NOTE,
        "background_cpu_busy_pct": harness.cpu_busy_pct(),
    }
    failures: list[str] = []

    def run(name: str, fn) -> None:
        if name in args.skip:
            doc[name] = None
            return
        print(f"[rules] {name} ...", flush=True)
        t0 = time.monotonic()
        try:
            doc[name] = fn()
            doc[name]["seconds"] = round(time.monotonic() - t0, 1)
        except Exception as exc:  # noqa: BLE001 - a failed phase is recorded; the others still run
            failures.append(f"{name}: {exc}")
            doc[name] = {"error": str(exc)[:3000]}
            print(f"[rules] {name} FAILED: {exc}", file=sys.stderr)

    try:
        with tempfile.TemporaryDirectory(prefix="meshfast-rules-bench-") as work:
            run("oversubscription", lambda: phase_oversubscription(args, Path(work)))
            run("in_process", lambda: phase_in_process(args))
            gc.collect()
            run("instructions", phase_instructions)
            run("proxy", lambda: phase_proxy(args, Path(work)))
            run("shm", lambda: phase_shm(args))
            run("start", lambda: phase_start(args, Path(work)))
            run("propagation", phase_propagation)
    except KeyboardInterrupt:
        failures.append("interrupted")
    doc["loadavg_end"] = list(os.getloadavg())
    busy = doc.get("background_cpu_busy_pct")
    doc["quiet_machine"] = busy is not None and busy < harness.BUSY_WARN_PCT
    if not doc["quiet_machine"]:
        doc["machine_note"] = (f"not a quiet machine: {busy}% of the CPUs busy before the run (other people's builds, "
                               f"tests and servers); load average {doc['provenance']['host']['loadavg_at_start']} at "
                               f"the start, {doc['loadavg_end']} at the end; each phase's cpu.other_busy_pct says how "
                               "much of it overlapped the measurements")
    failures += problems_of(doc)
    return harness.finish(doc, failures, started, out_path, "rules", print_tables, indent=1)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    sys.exit(main())
