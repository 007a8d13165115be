# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Figure 10: scale-out
# `cluster_bench.py`: one lone instance against one instance of a three-instance cluster on one
# PostgreSQL, side by side on the fast upstream (nginx). (a) Added latency of a non-streamed chat
# completion far from any cap, one connection back to back, each round's p50 as dots. (b) CPU per
# call under wrk: the serving workers, and every process of the contender (its other instances and
# PostgreSQL). (c) Near a cap: lease grants (database round trips a call waits for) per 1,000
# admitted calls, by how many calls' worth were left under the cap. (d) An idle slice coming back:
# the allowance's `used` and the idle instance's slice after its last call, and when the rest of the
# cap became usable from another instance.
#
# The run directory's `cluster.json` when the run has one; otherwise the newest full
# `bench/results/cluster-*.json` (committed with the bench), named in the summary's `source`.

# %%
import json
import os
import sys
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

# NOTE: under Jupyter there is no __file__; the notebook runs from its own folder.
sys.path.insert(0, str(Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()))
from _common import COLORS, ROOT, load, missing, run_dir, save, update_summary  # noqa: E402

cluster = load("cluster")
source = str(run_dir() / "cluster.json") if cluster else None
if cluster is None:
    explicit = os.environ.get("PAPER_CLUSTER_JSON")
    found = [Path(explicit)] if explicit else sorted(
        p for p in (ROOT / "bench" / "results").glob("cluster-*.json") if not p.name.endswith("-quick.json"))
    if found and found[-1].exists():
        cluster = json.loads(found[-1].read_text())
        path = found[-1].resolve()
        source = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)
summary: dict = {"measured": bool(cluster), "source": source}
s = (cluster or {}).get("summary") or {}
LONE, CLUSTER, SPREAD = "#9ecae1", COLORS["meshfast"], "#f28e2b"
fig, axes = plt.subplots(1, 4, figsize=(8.2, 2.7), gridspec_kw={"width_ratios": [1.0, 0.9, 1.3, 1.3]})

# %%
far = s.get("far") or {}
if far.get("cluster", {}).get("added_p50_us") is not None:
    ax = axes[0]
    x = np.arange(2)
    for k, (name, label, col) in enumerate((("lone", "lone", LONE), ("cluster", "cluster (a of 3)", CLUSTER))):
        vals = [far[name]["added_p50_us"], far[name]["added_p99_us"]]
        ax.bar(x + (k - 0.5) * 0.38, vals, 0.36, color=col, edgecolor="black", linewidth=0.3, label=label)
        for xi, v in zip(x, vals, strict=True):
            ax.text(xi + (k - 0.5) * 0.38, v, f"{v:,.0f}", ha="center", va="bottom", fontsize=5.5)
        direct = far.get("direct", {}).get("p50_us") or 0
        rounds = [r - direct for r in far[name].get("round_p50_us") or [] if r is not None]
        ax.plot([(k - 0.5) * 0.38] * len(rounds), rounds, "k.", markersize=2.5,
                label="each round's p50" if k == 0 else None)
    ax.set_xticks(x, ["added p50", "added p99"], fontsize=6.5)
    ax.set_ylim(0, 1.2 * max(far[n]["added_p99_us"] for n in ("lone", "cluster")))
    ax.set_ylabel("over direct (µs), 1 connection")
    ax.set_title("(a) far from any cap", fontsize=8.5)
    ax.legend(fontsize=5.3, loc="upper left")
else:
    missing(axes[0], "cluster_bench far (back to back)")

if far.get("cluster", {}).get("worker_cpu_us_per_call") is not None:
    ax = axes[1]
    x = np.arange(2)
    for k, (name, col) in enumerate((("lone", LONE), ("cluster", CLUSTER))):
        vals = [far[name]["worker_cpu_us_per_call"], far[name]["contender_cpu_us_per_call"]]
        ax.bar(x + (k - 0.5) * 0.38, vals, 0.36, color=col, edgecolor="black", linewidth=0.3)
        for xi, v in zip(x, vals, strict=True):
            ax.text(xi + (k - 0.5) * 0.38, v, f"{v:,.0f}", ha="center", va="bottom", fontsize=5.5)
    ax.set_xticks(x, ["serving\nworkers", "all of the\ncontender"], fontsize=6.5)
    ax.set_ylabel("CPU per call (µs), wrk")
    ax.set_title(f"(b) {far['lone'].get('rps', 0):,.0f} vs {far['cluster'].get('rps', 0):,.0f} req/s", fontsize=8.5)
else:
    missing(axes[1], "cluster_bench far (wrk)")

# %%
near = s.get("near") or {}
if near.get("cluster"):
    ax = axes[2]
    bins = list(near["cluster"]["grants_per_1k_by_calls_left"])
    bins = [b for b in bins if any((near.get(m) or {}).get("grants_per_1k_by_calls_left", {}).get(b) is not None
                                   for m in ("cluster", "spread"))]
    x = np.arange(len(bins))
    modes = [(m, lab, c) for m, lab, c in (("lone", "lone", LONE), ("cluster", "through a", CLUSTER),
                                           ("spread", "over a, b, c", SPREAD)) if near.get(m)]
    width = 0.8 / len(modes)
    for k, (mode, label, col) in enumerate(modes):
        vals = [near[mode]["grants_per_1k_by_calls_left"].get(b) or 0 for b in bins]
        xs = x + (k - (len(modes) - 1) / 2) * width
        ax.bar(xs, [max(v, 0.5) for v in vals], width * 0.95, color=col, edgecolor="black", linewidth=0.3,
               label=label)
        for xi, v in zip(xs, vals, strict=True):
            ax.text(xi, max(v, 0.5) * 1.1, f"{v:,.0f}", ha="center", va="bottom", fontsize=4.8, rotation=90)
    ax.set_yscale("log")
    ax.set_ylim(0.4, 20000)
    ax.set_xticks(x, [b.replace("+", "+\n") for b in bins], fontsize=6.5)
    ax.set_xlabel("calls' worth left under the cap", fontsize=7)
    ax.set_ylabel("lease grants per 1,000 calls")
    ax.set_title(f"(c) near a cap of {cluster['near']['cap_calls']:,} calls", fontsize=8.5)
    ax.legend(fontsize=5.3, loc="upper left")
else:
    missing(axes[2], "cluster_bench near")

# %%
ret = (cluster or {}).get("return") or {}
trials = ret.get("trials") or []
if trials:
    ax = axes[3]
    call_nano = float(cluster["config"].get("near_call_usd") or "0.004") * 1e9
    for j, t in enumerate(trials):
        tl = t["allowance_timeline"]
        if not tl:
            continue
        ts = [p["t_s"] for p in tl] + [max(t["usable_from_a_s"] or 0, tl[-1]["t_s"]) + 0.5]
        used = [p["used_nano_usd"] / call_nano for p in tl]
        amount = [(p["b_amount_nano_usd"] or 0) / call_nano for p in tl]
        ax.step(ts, used + used[-1:], where="post", color=CLUSTER, linewidth=1.0,
                label="allowance used" if j == 0 else None)
        ax.step(ts, amount + amount[-1:], where="post", color=SPREAD, linewidth=0.8, linestyle="--",
                label="b's slice" if j == 0 else None)
        if t["usable_from_a_s"] is not None:
            ax.axvline(t["usable_from_a_s"], color="#c0392b", linewidth=0.6,
                       label="rest usable from a" if j == 0 else None)
    ax.axhline(trials[0]["used_calls_on_b"], color="black", linewidth=0.5, linestyle=":", label="spent by b")
    ax.set_ylim(0, None)
    ax.set_xlabel("seconds after b's last call", fontsize=7)
    ax.set_ylabel("calls' worth")
    summ = ret.get("summary") or {}
    med = (summ.get("usable_from_a_s") or {}).get("median")
    ax.set_title(f"(d) idle slice back: {med:.1f} s (median)" if med is not None else "(d) idle slice back",
                 fontsize=8.5)
    ax.legend(fontsize=5.3, loc="upper right")
else:
    missing(axes[3], "cluster_bench return")
fig.tight_layout()
save(fig, "fig10_cluster")

# %%
if cluster:
    prov = cluster.get("provenance") or {}
    cfg = cluster.get("config") or {}
    idle = s.get("idle") or {}
    thr = (cluster.get("far") or {}).get("throughput") or {}
    summary.update({
        "ok": cluster.get("ok"), "failures": [f[:300] for f in cluster.get("failures", [])],
        "quick": cfg.get("quick"), "workers": cfg.get("workers"), "idle_workers": cfg.get("idle_workers"),
        "timestamp": cluster.get("timestamp"), "git_sha": prov.get("git_sha"), "git_dirty": prov.get("git_dirty"),
        "command": cluster.get("command"), "quiet_machine": cluster.get("quiet_machine"),
        "background_cpu_busy_pct": cluster.get("background_cpu_busy_pct"),
        "loadavg_start": (prov.get("host") or {}).get("loadavg_at_start"), "loadavg_end": cluster.get("loadavg_end"),
        "postgres_version": (((cluster.get("setup") or {}).get("postgres_settings") or {}).get("pg-cluster") or {}).get(
            "server_version"),
        "b2b": {"rounds": cfg.get("b2b_rounds"), "duration_s": cfg.get("b2b_duration"),
                "resume_s": cfg.get("resume_s")},
        "wrk": {"connections": cfg.get("connections"), "duration_s": cfg.get("wrk_duration"),
                "warmup_s": cfg.get("wrk_warmup"), "rounds": cfg.get("wrk_rounds")},
        "far": far, "cluster_minus_lone": s.get("cluster_minus_lone"),
        "paired_p50_us": s.get("paired_p50_us"), "p50_equal_within_noise": s.get("p50_equal_within_noise"),
        "wrk_paired": s.get("wrk_paired"), "resume_idle_s": cfg.get("resume_idle_s"),
        # Other work on the machine during each wrk run (lone and cluster runs in the order they ran).
        "wrk_other_busy_pct": [r["cpu"].get("other_busy_pct") for c in ("lone", "cluster")
                               for r in (thr.get("runs") or {}).get(c, [])],
        "resume_trials": cfg.get("resume_trials"),
        "idle": idle, "near": near, "near_cap_calls": (cluster.get("near") or {}).get("cap_calls"),
        "near_call_usd": cfg.get("near_call_usd"), "top_up_idle_s": (cluster.get("near") or {}).get("top_up_idle_s"),
        "return": ret.get("summary"), "return_calls": cfg.get("return_calls"), "return_used": cfg.get("return_used"),
        "return_trials": len(trials), "return_goal_s": ret.get("goal_s"),
        "grant_cross_check": cluster.get("grant_cross_check"),
    })
    c_near = near.get("cluster") or {}
    if c_near.get("with_grant_p50_us") is not None and c_near.get("without_grant_p50_us") is not None:
        summary["grant_wait_p50_us"] = round(c_near["with_grant_p50_us"] - c_near["without_grant_p50_us"], 1)
update_summary("cluster", summary)
