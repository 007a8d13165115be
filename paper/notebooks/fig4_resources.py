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
# # Figure 4: memory against open sockets, latency against payload
# (a) Peak RSS of meshfast's processes (main + Granian workers, PostgreSQL excluded) against the peak
# number of established client sockets, per capacity run, with a least-squares line: the memory one
# held connection costs. (b) RSS and sockets over time during the largest held-connection run.
# (c) Time to last byte against the size of the query, 1 KB to 5 MB, sequential at 5 req/s
# (`payload_bench.py`), meshfast and direct.

# %%
import sys
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

# NOTE: under Jupyter there is no __file__; the notebook runs from its own folder.
sys.path.insert(0, str(Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()))
from _common import COLORS, load, missing, save, update_summary  # noqa: E402

cap = load("capacity")
fig, axes = plt.subplots(1, 3, figsize=(7.4, 2.6))
summary: dict = {"measured": bool(cap and cap.get("runs"))}

# %%
if cap and cap.get("runs"):
    runs = cap["runs"]
    pts = [(r["resources"]["peak_sockets"] or 0, r["resources"]["peak_rss_mb"] or 0, n) for n, r in runs.items()]
    idle = cap.get("idle", {}).get("rss_mb")
    if idle:
        pts.append((0, idle, "idle"))
    xs = np.array([p[0] for p in pts], dtype=float)
    ys = np.array([p[1] for p in pts], dtype=float)
    axes[0].scatter(xs, ys, color=COLORS["meshfast"], s=14, zorder=3)
    for x, y_, n in pts:
        axes[0].annotate(n.replace("held_", "").replace("_", " "), (x, y_), fontsize=5.5, xytext=(3, 2),
                         textcoords="offset points")
    if len(set(xs)) >= 2:
        slope, icpt = np.polyfit(xs, ys, 1)
        grid = np.linspace(0, xs.max(), 20)
        axes[0].plot(grid, slope * grid + icpt, ":", color="grey",
                     label=f"{slope * 1024:.0f} KiB per socket")
        axes[0].legend(fontsize=6.5)
        summary["kib_per_socket"] = round(slope * 1024, 1)
        summary["rss_intercept_mb"] = round(icpt, 1)
    axes[0].set_xlabel("established client sockets (peak)")
    axes[0].set_ylabel("RSS (MiB, peak)")
    axes[0].set_title("(a) memory vs sockets")
    held = [n for n in runs if n.startswith("held_")]
    if held:
        big = max(held, key=lambda n: runs[n]["connections"])
        series = runs[big]["resources"]["series"]
        t = [s[0] for s in series]
        axes[1].plot(t, [s[1] for s in series], "-", color=COLORS["meshfast"], label="RSS (MiB)")
        ax2 = axes[1].twinx()
        ax2.plot(t, [s[2] for s in series], "--", color="#f28e2b", label="sockets")
        ax2.set_ylabel("sockets", color="#f28e2b")
        ax2.spines["right"].set_visible(True)
        axes[1].set_xlabel("s into the run")
        axes[1].set_ylabel("RSS (MiB)")
        axes[1].set_title(f"(b) {big.replace('held_', '').replace('_', ' ')} held")
    summary["idle_rss_mb"] = idle
    summary["peaks"] = {n: {"sockets": r["resources"]["peak_sockets"], "rss_mb": r["resources"]["peak_rss_mb"]}
                        for n, r in runs.items()}
else:
    missing(axes[0], "capacity_bench")
    missing(axes[1], "capacity_bench")
payload = load("payload")
if payload and payload.get("sizes"):
    sizes = payload["sizes"]
    kb = [s_["query_bytes"] / 1000 for s_ in sizes]
    for name in ("direct", "meshfast"):
        axes[2].plot(kb, [s_["targets"][name]["total_us"].get("p50", 0) / 1000 for s_ in sizes], "o-",
                     color=COLORS[name], markersize=3, label=f"{name} p50")
        axes[2].plot(kb, [s_["targets"][name]["total_us"].get("p99", 0) / 1000 for s_ in sizes], ":",
                     color=COLORS[name], label=f"{name} p99")
    axes[2].set_xscale("log")
    axes[2].set_yscale("log")
    axes[2].set_xlabel("query size (KB)")
    axes[2].set_ylabel("time to last byte (ms)")
    axes[2].legend(fontsize=6)
    big = [s_ for s_ in sizes if s_["query_bytes"] >= 1_000_000]
    if len(big) >= 2:
        lo, hi = big[0], big[-1]
        per_mb = ((hi["targets"]["meshfast"]["total_us"]["p50"] - lo["targets"]["meshfast"]["total_us"]["p50"])
                  / 1000 / ((hi["query_bytes"] - lo["query_bytes"]) / 1e6))
        summary["meshfast_ms_per_mb"] = round(per_mb, 2)
    summary["payload_measured"] = True
    summary["payload"] = [{"query_bytes": s_["query_bytes"],
                           "direct_p50_ms": round(s_["targets"]["direct"]["total_us"].get("p50", 0) / 1000, 3),
                           "meshfast_p50_ms": round(s_["targets"]["meshfast"]["total_us"].get("p50", 0) / 1000, 3),
                           "meshfast_p99_ms": round(s_["targets"]["meshfast"]["total_us"].get("p99", 0) / 1000, 3),
                           "added_p50_ms": round(s_["added_us"].get("p50", 0) / 1000, 3)} for s_ in sizes]
    summary["payload_rate_rps"] = payload["config"]["rate_rps"]
    summary["payload_count"] = payload["config"]["count"]
else:
    missing(axes[2], "payload_bench")
    summary["payload_measured"] = False
axes[2].set_title("(c) latency vs payload")
fig.tight_layout()
save(fig, "fig4_resources")
update_summary("resources", summary)
