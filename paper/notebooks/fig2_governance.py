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
# # Figure 2: governance under load
# One provider limited to 50 req/s (`governance_bench.py`). (a) Closed loop: N users resend as soon
# as an answer arrives; latency of the 200s against the theoretical N/50 s (dotted) and the 4 s wait
# ceiling (dash-dot). (b) Goodput (200s completed per second) and the 503 share. (c) Open loop at
# fixed arrival rates: latency from the due time, whole window and its last half. (d) Goodput and
# 503 share of the open loop.

# %%
import sys
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

# NOTE: under Jupyter there is no __file__; the notebook runs from its own folder.
sys.path.insert(0, str(Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()))
from _common import COLORS, load, missing, ms, save, update_summary  # noqa: E402

gov = load("governance")
fig, grid_axes = plt.subplots(2, 2, figsize=(7.4, 5.0))
axes = grid_axes.ravel()
summary: dict = {"measured": bool(gov and (gov.get("closed_loop") or gov.get("open_loop")))}

# %%
cl = (gov or {}).get("closed_loop")
if cl:
    runs = cl["runs"]
    users = [r["users"] for r in runs]
    for p, style in (("p50", "o-"), ("p95", "s--"), ("p99", "^:")):
        axes[0].plot(users, [r["latency_ok_ms"].get(p) for r in runs], style, color=COLORS["meshfast"],
                     markersize=3, label=f"{p} of 200s", alpha={"p50": 1, "p95": 0.75, "p99": 0.5}[p])
    grid = np.geomspace(max(1, min(users)), max(users), 50)
    axes[0].plot(grid, [1000 * n / cl["rps_limit"] for n in grid], ":", color="grey", label="N / 50 s")
    axes[0].axhline(1000 * cl["wait_ceiling_s"], color="#c0392b", linestyle="-.", linewidth=0.8,
                    label=f"{cl['wait_ceiling_s']:g} s wait ceiling")
    axes[0].set_xscale("log")
    axes[0].set_yscale("log")
    axes[0].set_xlabel("users (closed loop)")
    axes[0].set_ylabel("latency (ms)")
    axes[0].set_title("(a) closed loop: latency")
    axes[0].legend(fontsize=6)
    axes[1].plot(users, [r["served_rps"] for r in runs], "o-", color=COLORS["meshfast"], markersize=3,
                 label="goodput (200/s)")
    axes[1].axhline(cl["rps_limit"], color="grey", linestyle=":", label=f"limit {cl['rps_limit']}/s")
    ax2 = axes[1].twinx()
    ax2.plot(users, [100 * (r["shed_share"] or 0) for r in runs], "x--", color="#c0392b", label="503 share")
    ax2.set_ylabel("503 share of requests (%)", color="#c0392b")
    ax2.set_ylim(0, 100)
    ax2.spines["right"].set_visible(True)
    axes[1].set_xscale("log")
    axes[1].set_xlabel("users (closed loop)")
    axes[1].set_ylabel("requests/s")
    axes[1].set_ylim(0, max(cl["rps_limit"] * 1.5, max(r["served_rps"] for r in runs) * 1.1))
    axes[1].set_title("(b) closed loop: goodput, shed")
    axes[1].legend(loc="lower left", fontsize=6)
    summary["closed_loop"] = {
        "rps_limit": cl["rps_limit"], "wait_ceiling_s": cl["wait_ceiling_s"], "duration_s": cl["duration_s"],
        "runs": [{"users": r["users"], "served_rps": r["served_rps"], "expected_latency_s": r["expected_latency_s"],
                  "p50_ms": r["latency_ok_ms"].get("p50"), "p99_ms": r["latency_ok_ms"].get("p99"),
                  "shed_share": r["shed_share"], "errors": r["error_count"],
                  # The limiter's wait is in the gateway phase; the upstream phase is the call itself.
                  **{f"{ph}_p50_ms": ms(((r.get("phase_split") or {}).get(ph) or {}).get("p50"), 3)
                     for ph in ("receive", "gateway", "upstream")}} for r in runs]}
else:
    missing(axes[0], "governance_bench closed loop")
    missing(axes[1], "governance_bench closed loop")

# %%
ol = (gov or {}).get("open_loop")
if ol:
    runs = ol["runs"]
    rates = [r["rate_rps"] for r in runs]
    axes[2].plot(rates, [r["latency_ok_ms"].get("p50") for r in runs], "o-", color=COLORS["meshfast"],
                 markersize=3, label="p50")
    axes[2].plot(rates, [r["latency_ok_ms"].get("p99") for r in runs], "^:", color=COLORS["meshfast"],
                 markersize=3, alpha=0.6, label="p99")
    axes[2].plot(rates, [r["last_half"]["latency_ok_ms"].get("p50") for r in runs], "o-", color="#59a14f",
                 markersize=3, label="p50, last half")
    axes[2].axvline(ol["rps_limit"], color="grey", linestyle=":", label="limit")
    axes[2].axhline(1000 * ol["wait_ceiling_s"], color="#c0392b", linestyle="-.", linewidth=0.8)
    axes[2].set_yscale("log")
    axes[2].set_xlabel("arrival rate (req/s)")
    axes[2].set_ylabel("latency from due time (ms)")
    axes[2].set_title("(c) open loop: latency")
    axes[2].legend(fontsize=6)
    axes[3].plot(rates, [r["served_rps"] for r in runs], "o-", color=COLORS["meshfast"], markersize=3,
                 label="goodput")
    axes[3].plot(rates, rates, ":", color="grey", label="offered")
    ax3 = axes[3].twinx()
    ax3.plot(rates, [100 * (r["shed_share"] or 0) for r in runs], "x--", color="#c0392b")
    ax3.set_ylabel("503 share (%)", color="#c0392b")
    ax3.set_ylim(0, 100)
    ax3.spines["right"].set_visible(True)
    axes[3].set_xlabel("arrival rate (req/s)")
    axes[3].set_ylabel("requests/s")
    axes[3].set_title("(d) open loop: goodput, shed")
    axes[3].legend(loc="upper left", fontsize=6)
    summary["open_loop"] = {
        "rps_limit": ol["rps_limit"], "duration_s": ol["duration_s"],
        "runs": [{"rate_rps": r["rate_rps"], "served_rps": r["served_rps"], "p50_ms": r["latency_ok_ms"].get("p50"),
                  "p99_ms": r["latency_ok_ms"].get("p99"), "shed_share": r["shed_share"],
                  "last_half_p50_ms": r["last_half"]["latency_ok_ms"].get("p50"), "errors": r["error_count"]}
                 for r in runs]}
    under = [r for r in runs if r["rate_rps"] <= ol["rps_limit"] * 0.8]
    if under:
        summary["open_loop"]["p50_below_limit_ms"] = max(r["latency_ok_ms"].get("p50") or 0 for r in under)
else:
    missing(axes[2], "governance_bench open loop")
    missing(axes[3], "governance_bench open loop")
fig.tight_layout()
save(fig, "fig2_governance")

# %%
ip = (gov or {}).get("in_process")
if ip:
    summary["in_process"] = {"policies_on_ns": ip["policies_on"]["median_ns"],
                             "policies_off_ns": ip["policies_off"]["median_ns"],
                             "governance_cost_ns": ip["governance_cost_ns"], "goal_ns": ip["goal_ns"]}
summary["ok"] = (gov or {}).get("ok")
update_summary("governance", summary)
