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
# # Figure 9: spend rules
# `rules_bench.py`. (a) Oversubscription: one person, a block threshold that admits N calls' worst
# cases, 4N and 10N calls at once over two models of the scope on a two-worker gateway; calls
# admitted (in the burst, then one at a time until refused) and spend recorded in the rows, in units
# of N, per run; the two-rule and shadow trials beside. (b) The decision in process (prepare +
# settle) with 0 and 100 rules on the large configuration, median and p99. (c) The proxy path's
# added latency over a direct call at one connection, the same build without and with rules, side by
# side in one run. (d) Requests/s at 64 connections (wrk) for the same.

# %%
import statistics
import sys
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

# NOTE: under Jupyter there is no __file__; the notebook runs from its own folder.
sys.path.insert(0, str(Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()))
from _common import COLORS, load, missing, save, update_summary  # noqa: E402

rules = load("rules")
summary: dict = {"measured": bool(rules)}
fig, axes = plt.subplots(1, 4, figsize=(8.2, 2.7), gridspec_kw={"width_ratios": [1.5, 0.9, 1.0, 0.8]})
NORULES, WITHRULES, CAP = "#9ecae1", COLORS["meshfast"], "#c0392b"

# %%
over = (rules or {}).get("oversubscription") or {}
trials = over.get("trials") or []
if trials:
    ax = axes[0]
    names = list(dict.fromkeys(t["trial"] for t in trials))
    for i, name in enumerate(names):
        mine = [t for t in trials if t["trial"] == name]
        for j, t in enumerate(mine):
            x = i + (j - (len(mine) - 1) / 2) * 0.18
            n = t["cap_calls"]
            first = next(iter(t["rules"].values()))
            spent_n = first["recorded_spend_usd"] / first["threshold_usd"]
            ax.bar(x, t["admitted"] / n, 0.16, color=WITHRULES, edgecolor="black", linewidth=0.3,
                   label="admitted in the burst" if i == j == 0 else None)
            ax.bar(x, t["topped_up_after"] / n, 0.16, bottom=t["admitted"] / n, color=NORULES, edgecolor="black",
                   linewidth=0.3, label="then one at a time" if i == j == 0 else None)
            ax.plot(x, spent_n, "k_", markersize=9, label="recorded spend / threshold" if i == j == 0 else None)
    ax.axhline(1.0, color=CAP, linestyle="--", linewidth=0.8, label="threshold (N calls)")
    sent = {t["trial"]: t["calls"] for t in trials}
    ax.set_xticks(range(len(names)), [f"{n}\n{sent[n]} sent" for n in names], fontsize=6)
    ax.set_ylabel("calls or spend, in units of N")
    ymax = max(max(t["admitted_total"] / t["cap_calls"] for t in trials),
               max(r["recorded_spend_usd"] / r["threshold_usd"] for t in trials for r in t["rules"].values()))
    ax.set_ylim(0, max(1.3, ymax * 1.15))
    worst = max(t["max_overshoot_usd"] for t in trials)
    ax.set_title(f"(a) N={trials[0]['cap_calls']}: overshoot {worst:g} USD", fontsize=8.5)
    ax.legend(fontsize=5.3, loc="upper left")
else:
    missing(axes[0], "rules_bench oversubscription")

# %%
ip = (rules or {}).get("in_process") or {}
variants = ip.get("variants") or {}
if variants:
    ax = axes[1]
    labels = [("no_rules", "0 rules", NORULES), ("rules", f"{ip['rules']} rules", WITHRULES)]
    x = np.arange(2)
    for k, (stat, hatch) in enumerate((("median_us", None), ("p99_us", "//"))):
        vals = [variants[v][stat] for v, _, _ in labels]
        ax.bar(x + (k - 0.5) * 0.38, vals, 0.36, color=[c for _, _, c in labels], hatch=hatch, edgecolor="black",
               linewidth=0.3, label=stat.split("_")[0])
        for xi, v in zip(x, vals, strict=True):
            ax.text(xi + (k - 0.5) * 0.38, v, f"{v:.1f}", ha="center", va="bottom", fontsize=5.5)
    ax.axhline(ip.get("goal_median_us", 10), color=CAP, linestyle="--", linewidth=0.8, label="goal (median)")
    ax.set_xticks(x, [lab for _, lab, _ in labels], fontsize=6.5)
    ax.set_ylabel("prepare + settle (µs)")
    worst = variants.get("rules_all_cover")
    note = (f"\nall {worst['covering_entries']} entries covering: {worst['median_us']:,.0f} µs median"
            if worst else "")
    ax.set_title(f"(b) in process, {ip['users']:,} people{note}", fontsize=8.5 if not worst else 7)
    ax.legend(fontsize=5.5, loc="upper left")
else:
    missing(axes[1], "rules_bench in_process")

# %%
px = ((rules or {}).get("proxy") or {}).get("summary") or {}
rows = px.get("targets") or {}
sides = [("meshfast-norules", "no rules", NORULES), ("meshfast-rules", "with rules", WITHRULES)]
if rows.get("meshfast-rules", {}).get("added_p50_us") is not None:
    ax = axes[2]
    x = np.arange(2)
    for k, (name, label, col) in enumerate(sides):
        vals = [rows[name].get("added_p50_us"), rows[name].get("added_p99_us")]
        ax.bar(x + (k - 0.5) * 0.38, vals, 0.36, color=col, edgecolor="black", linewidth=0.3, label=label)
        for xi, v in zip(x, vals, strict=True):
            ax.text(xi + (k - 0.5) * 0.38, v, f"{v:,.0f}", ha="center", va="bottom", fontsize=5.5)
    ax.set_xticks(x, ["added p50", "added p99"], fontsize=6.5)
    ax.set_ylabel("over direct (µs), 1 connection")
    ax.set_title("(c) proxy path, added", fontsize=8.5)
    ax.legend(fontsize=5.5, loc="upper left")
else:
    missing(axes[2], "rules_bench proxy")
if rows.get("meshfast-rules", {}).get("rps") is not None:
    ax = axes[3]
    vals = [rows[name]["rps"] for name, _, _ in sides]
    ax.bar([0, 1], vals, 0.6, color=[c for _, _, c in sides], edgecolor="black", linewidth=0.3)
    for xi, v in enumerate(vals):
        ax.text(xi, v, f"{v:,.0f}", ha="center", va="bottom", fontsize=5.5)
    ax.set_xticks([0, 1], [lab for _, lab, _ in sides], fontsize=6.5)
    ax.set_ylabel("requests/s (wrk, 64 conn.)")
    ax.set_title("(d) throughput", fontsize=8.5)
else:
    missing(axes[3], "rules_bench proxy (wrk)")
fig.tight_layout()
save(fig, "fig9_rules")

# %%
if rules:
    summary.update({"ok": rules.get("ok"), "failures": [f[:300] for f in rules.get("failures", [])],
                    "quick": rules["config"].get("quick"), "workers": rules["config"].get("workers"),
                    "background_cpu_busy_pct": rules.get("background_cpu_busy_pct"),
                    "timestamp": rules.get("timestamp"), "git_sha": rules["provenance"].get("git_sha"),
                    "git_dirty": rules["provenance"].get("git_dirty"),
                    "quiet_machine": rules.get("quiet_machine"), "loadavg_start":
                    rules["provenance"]["host"].get("loadavg_at_start"), "loadavg_end": rules.get("loadavg_end")})
    osum = over.get("summary") or {}
    summary["oversubscription"] = {
        "cap_calls": over.get("cap_calls"), "call_usd": over.get("call_usd"), "repeats": over.get("repeats"),
        "max_overshoot_usd": max((t["max_overshoot_usd"] for t in trials), default=None),
        "trials": {name: {"runs": s["runs"], "calls": s["calls"], "admitted_min": min(s["admitted"]),
                          "admitted_max": max(s["admitted"]), "refused_min": min(s["refused"]),
                          "refused_max": max(s["refused"]), "filled_min": min(s["admitted_total"]),
                          "filled_max": max(s["admitted_total"]), "fill_max": round(max(s["fill"]), 3),
                          "peak_in_flight_max": max(p or 0 for p in s["peak_in_flight"]),
                          "would_deny_min": min(s["would_deny"]), "would_deny_max": max(s["would_deny"]),
                          "max_overshoot_usd": s["max_overshoot_usd"]}
                   for name, s in osum.items()},
    } if trials else None
    summary["in_process"] = {
        "users": ip.get("users"), "models": ip.get("models"), "grants": ip.get("grants"), "rules": ip.get("rules"),
        "entries": ip.get("entries"),
        **{f"{v}_{k}": variants[v][k] for v in ("rules", "no_rules") for k in
           ("median_us", "p99_us", "load_s", "slots_per_active_pair", "calls") if v in variants},
        **({f"all_cover_{k}": variants["rules_all_cover"].get(k) for k in
            ("median_us", "p99_us", "calls", "covering_entries", "us_per_covering_entry", "slots_per_active_pair")}
           if "rules_all_cover" in variants else {}),
        "goal_median_us": ip.get("goal_median_us"),
    } if variants else None
    ins = rules.get("instructions") or {}
    summary["instructions_per_decision"] = ins.get("per_decision")
    pset = ((rules.get("proxy") or {}).get("setup") or {}).get("rules") or {}
    summary["proxy"] = {"targets": rows, "delta": px.get("rules_minus_norules"), "setup": pset,
                        "idle_s": (rules.get("proxy") or {}).get("idle_cpu", {}).get("wall_s"),
                        "connections": rules["config"].get("connections")} if rows else None
    shm = rules.get("shm") or {}
    summary["shm"] = {"default_mib": shm["default_segment"]["mib"], "default_slots": shm["default_segment"]["slots"],
                      "goal_mib": shm["goal_mib"], "active_pairs": shm["active_pairs"],
                      "slots_per_pair_sized": shm["slots_per_pair_sized"], **shm["active"],
                      "within_goal": shm["within_goal"], "decision_empty_table": shm["decision_empty_table"],
                      "decision_spread": shm["decision_spread"], "decision_hot": shm["decision_hot"],
                      "pairs_default_holds": int(shm["default_segment"]["slots"] * shm["active"]["load"]
                                                 / shm["active"]["slots_per_active_pair"])} \
        if shm and "active" in shm else None
    start = rules.get("start") or {}
    phases: dict[str, list[float]] = {}
    for run in start.get("runs") or []:
        for phase in run["phases"]:
            phases.setdefault(phase["name"], []).append(phase["s"])
    summary["start"] = {**{k: start.get(k) for k in ("users", "grants", "active_pairs", "workers", "goal_s",
                                                      "own_s_median", "own_s_best", "total_s_median",
                                                      "database_s_median", "within_goal")},
                        "runs": len(start.get("runs") or []),
                        "phases": [{"name": n, "median_s": round(statistics.median(v), 3),
                                    "database": any(p["database"] for r in start["runs"] for p in r["phases"]
                                                    if p["name"] == n)} for n, v in phases.items()]} \
        if start.get("runs") else None
    prop = rules.get("propagation") or {}
    summary["propagation"] = ({k: prop.get(k) for k in ("grants", "full_rebuild_s", "reorg_ms", "new_rule_ms", "rc")}
                              if prop else None)
update_summary("rules", summary)
