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
# # Figure 8: the load generators' own ceiling
# Every client the paper uses against a trivial server (`ceiling_bench.py`: Granian RSGI, a fixed
# ~1 KB SSE stream per `POST`) on the same cores. (a) Max requests/s of wrk (32 connections), of
# loadgen with one connection back to back, and of governance_bench's closed loop (one thread per
# user), next to the most meshfast and the bare forwarder served in the same run's wrk runs
# (`proxy_bench.py`). (b) loadgen's open loop at fixed rates: how late requests left the client
# (p50, p99) against the interval between arrivals; a hollow marker is a rate whose schedule was not
# kept. (c) Who used the CPUs in each phase.

# %%
import sys
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

# NOTE: under Jupyter there is no __file__; the notebook runs from its own folder.
sys.path.insert(0, str(Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()))
from _common import COLORS, color, load, missing, save, update_summary  # noqa: E402

ceil = load("ceiling")
proxy = load("proxy")
fig, axes = plt.subplots(1, 3, figsize=(7.8, 3.0), gridspec_kw={"width_ratios": [1.35, 1.05, 0.95]})
summary: dict = {"measured": bool(ceil and (ceil.get("wrk") or ceil.get("loadgen_closed")))}
GEN = "#59a14f"  # the generators (the trivial server is grey, as a ceiling is elsewhere)

# %%
wrk = (ceil or {}).get("wrk")
closed = (ceil or {}).get("loadgen_closed")
gov = (ceil or {}).get("governance_closed")
best_gov = max((gov or {}).get("runs") or [], key=lambda r: r["served_rps"] or 0, default=None)
bars: list[tuple[str, float, str, str]] = []  # (label, req/s, colour, note)
if wrk:
    split = wrk["cpu_split"]
    bars.append((f"wrk -c{ceil['config']['wrk']['connections']}\n→ trivial", wrk["requests_per_s"], GEN,
                 f"CPUs: client {split['generator_pct']:.0f}%,\n server {split['server_pct']:.0f}%"))
if closed:
    bars.append(("loadgen, 1 conn\n→ trivial", closed["requests_per_s"], GEN,
                 f"{closed['client_cpu_us_per_request']:.0f} µs client CPU/req"))
if best_gov:
    bars.append((f"governance client\n{best_gov['users']} users → trivial", best_gov["served_rps"], GEN,
                 f"{best_gov['client_cpu_us_per_request']:.0f} µs client CPU/req"))
proxy_runs = ((proxy or {}).get("throughput") or {}).get("runs") or {}
for name in ("meshfast-anthropic", "forwarder-anthropic"):
    if name in proxy_runs:
        r = proxy_runs[name]
        wrk_cpu_s, wrk_s = r["cpu"]["cpu_s"].get("bench_client", 0), r["wrk"]["duration_us"] / 1e6
        bars.append((f"wrk → {name.split('-')[0]}\n(proxy run)", r["requests_per_s"], color(name),
                     f"wrk {wrk_cpu_s:.1f} cpu s / {wrk_s:.0f} s"))
if bars:
    y = np.arange(len(bars))
    axes[0].barh(y, [b[1] for b in bars], color=[b[2] for b in bars], edgecolor="black", linewidth=0.3)
    for yi, (_, rps, _, note) in zip(y, bars, strict=True):
        axes[0].text(rps, yi, f" {rps:,.0f}/s\n {note}", va="center", fontsize=5.8)
    axes[0].set_yticks(y, [b[0] for b in bars], fontsize=6.5)
    axes[0].invert_yaxis()
    axes[0].set_xlim(0, max(b[1] for b in bars) * 2.1)
    axes[0].set_xlabel("requests/s (shared cores)")
    axes[0].set_title("(a) max requests/s")
else:
    missing(axes[0], "ceiling_bench")

# %%
ol = (ceil or {}).get("loadgen_open")
if ol and ol.get("runs"):
    runs = ol["runs"]
    rates = [r["rate_rps"] for r in runs]
    for p, style, alpha in (("p50", "o-", 1.0), ("p99", "s--", 0.6)):
        vals = [r["late_us"].get(p) for r in runs]
        axes[1].plot(rates, vals, style, color=GEN, alpha=alpha, markersize=3.5, label=f"lateness {p}")
        bad = [(x, v) for x, v, r in zip(rates, vals, runs, strict=True) if not r["kept"]]
        if bad:
            axes[1].plot(*zip(*bad, strict=True), "o", markersize=7, markerfacecolor="none", color="#c0392b")
    grid = np.geomspace(min(rates), max(rates), 50)
    axes[1].plot(grid, 1e6 / grid, ":", color="grey", label="interval (1/rate)")
    axes[1].set_xscale("log")
    axes[1].set_yscale("log")
    axes[1].set_xlabel("target rate (req/s, one connection)")
    axes[1].set_ylabel("send time - due time (µs)")
    kept = ol.get("kept_up_to_rps")
    axes[1].set_title(f"(b) open loop: kept up to {kept:,.0f}/s" if kept else "(b) open loop: schedule")
    axes[1].legend(fontsize=6, loc="upper right")
else:
    missing(axes[1], "ceiling_bench open loop")

# %%
phases: list[tuple[str, dict]] = []
if wrk:
    phases.append(("wrk", wrk["cpu_split"]))
if closed:
    phases.append(("loadgen\n1 conn", closed["cpu_split"]))
if ol and ol.get("runs"):
    top = ol["runs"][-1]
    phases.append((f"open\n{top['rate_rps']:g}/s", top["cpu_split"]))
if best_gov:
    phases.append((f"gov\n{best_gov['users']} u.", best_gov["cpu_split"]))
if phases:
    x = np.arange(len(phases))
    bottom = np.zeros(len(phases))
    for key, label, col in (("generator_pct", "client", GEN), ("server_pct", "trivial server", COLORS["hello"]),
                            ("other_pct", "rest of machine", "#e15759"), ("idle_pct", "idle", "#f0f0f0")):
        vals = np.array([(split.get(key) or 0.0) for _, split in phases])
        axes[2].bar(x, vals, 0.6, bottom=bottom, color=col, edgecolor="black", linewidth=0.3, label=label)
        bottom += vals
    axes[2].set_xticks(x, [p[0] for p in phases], fontsize=5.8)
    axes[2].set_ylim(0, 100)
    cpus = next((ph["cpu"]["cpus"] for ph in (wrk, closed, best_gov) if ph and "cpu" in ph), None)
    axes[2].set_ylabel(f"% of the {cpus} CPUs" if cpus else "% of the CPUs")
    axes[2].set_title("(c) CPU split per phase")
    axes[2].legend(fontsize=5.5, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
else:
    missing(axes[2], "ceiling_bench")
fig.tight_layout()
save(fig, "fig8_ceiling")

# %%
if summary["measured"]:
    s = ceil.get("summary") or {}
    summary.update({
        "ok": ceil.get("ok"),
        "failures": [f[:300] for f in ceil.get("failures", [])],
        "workers": ceil["config"]["workers"],
        "stream_body_bytes": ceil["config"]["stream_body_bytes"],
        "wrk_connections": ceil["config"]["wrk"]["connections"],
        "wrk_rps": s.get("wrk_rps"),
        "wrk_p99_ms": wrk["latency_p99_ms"] if wrk else None,
        "wrk_cpu_split": wrk["cpu_split"] if wrk else None,
        "wrk_cpu_us_per_request": wrk.get("generator_cpu_us_per_request") if wrk else None,
        "loadgen_closed_rps": s.get("loadgen_closed_rps"),
        "loadgen_closed_p50_us": s.get("loadgen_closed_p50_us"),
        "loadgen_client_cpu_us_per_request": s.get("loadgen_client_cpu_us_per_request"),
        "loadgen_closed_cpu_split": closed["cpu_split"] if closed else None,
        "open_kept_up_to_rps": s.get("loadgen_open_kept_up_to_rps"),
        "open_first_missed_rps": s.get("loadgen_open_first_missed_rps"),
        "open_max_rate_rps": max(ol["rates_rps"]) if ol else None,
        "open_keep_rule": ol.get("keep_rule") if ol else None,
        "open_runs": [{"rate_rps": r["rate_rps"], "achieved_send_rps": r["achieved_send_rps"],
                       "late_p50_us": r["late_us"].get("p50"), "late_p99_us": r["late_us"].get("p99"),
                       "backlogged_share": r["backlogged_share"], "client_cpu_us_per_request":
                       r["client_cpu_us_per_request"], "kept": r["kept"]} for r in (ol or {}).get("runs", [])],
        "governance_max_rps": s.get("governance_closed_max_rps"),
        "governance_paper_users": s.get("governance_closed_paper_users"),
        "governance_paper_users_rps": s.get("governance_closed_paper_users_rps"),
        "governance_users": s.get("governance_closed_max_rps_users"),
        "governance_p50_ms": best_gov["latency_ok_ms"].get("p50") if best_gov else None,
        "governance_cpu_us_per_request": best_gov["client_cpu_us_per_request"] if best_gov else None,
    })
    mf = proxy_runs.get("meshfast-anthropic", {}).get("requests_per_s")
    fw = proxy_runs.get("forwarder-anthropic", {}).get("requests_per_s")
    summary["proxy_meshfast_rps"], summary["proxy_forwarder_rps"] = mf, fw
    top = max([x for x in (mf, fw) if x] or [0])
    summary["wrk_headroom_over_proxy"] = round(s["wrk_rps"] / top, 1) if top and s.get("wrk_rps") else None
update_summary("ceiling", summary)
