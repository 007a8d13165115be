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
# # Figure 12: the floor
# `floor_bench.py`: one fast upstream (nginx answering a fixed 1.7 KB OpenAI stream) and, side by
# side in one run on the same event loop, the direct call, a compiled forwarder (hyper, pooled), two
# bare Python forwarders (Granian with aiohttp, and with meshfast's own client), Granian's hello world
# and governed meshfast (a budget, an hourly cap, every row written) on its chat route and
# `/v1/proxy`. (a) Added latency over the direct call at one connection (p50, p99). (b) Requests/s
# at 64 connections. (c) The serving processes' CPU per call under that load.

# %%
import sys
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

# NOTE: under Jupyter there is no __file__; the notebook runs from its own folder.
sys.path.insert(0, str(Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()))
from _common import COLORS, load, missing, save, update_summary  # noqa: E402

floor = load("floor")
rows = (floor or {}).get("summary") or {}
TARGETS = ["compiled", "py-aiohttp", "py-native", "py-offloop", "rs-offloop", "hello", "meshfast-chat",
           "meshfast-proxy"]
LABELS = {"compiled": "compiled", "py-aiohttp": "py+aiohttp", "py-native": "py+own client",
          "py-offloop": "py+threads I/O", "rs-offloop": "py+compiled I/O", "hello": "hello",
          "meshfast-chat": "meshfast chat", "meshfast-proxy": "meshfast proxy"}
TINT = {"compiled": "#59a14f", "py-aiohttp": COLORS["forwarder"], "py-native": COLORS["forwarder-native"],
        "py-offloop": "#b07aa1", "rs-offloop": "#ff9da7",
        "hello": COLORS["hello"], "meshfast-chat": COLORS["meshfast"], "meshfast-proxy": "#a0cbe8"}
present = [t for t in TARGETS if t in rows]
fig, axes = plt.subplots(1, 3, figsize=(8.4, 3.0))

# %%
if present:
    x = np.arange(len(present))
    colors = [TINT[t] for t in present]
    ax = axes[0]
    p50 = [rows[t].get("b2b_added_p50_us") or 0 for t in present]
    p99 = [rows[t].get("b2b_added_p99_us") or 0 for t in present]
    ax.bar(x - 0.2, p50, 0.4, color=colors, edgecolor="black", linewidth=0.3, label="p50")
    ax.bar(x + 0.2, p99, 0.4, color=colors, edgecolor="black", linewidth=0.3, hatch="///", alpha=0.6, label="p99")
    ax.axhline(150, color="#c0392b", linewidth=0.7, linestyle="--")
    ax.set_xticks(x, [LABELS[t] for t in present], fontsize=5.5, rotation=35, ha="right")
    ax.set_yscale("log")
    ax.set_ylabel("added over direct (µs)")
    ax.set_title("(a) 1 connection: added p50, p99", fontsize=8.5)
    ax.legend(fontsize=5.5, loc="upper left")
    for i, t in enumerate(["rps", "worker_cpu_us_per_call"]):
        ax = axes[1 + i]
        values = [rows[name].get(t) or 0 for name in present]
        ax.bar(x, values, 0.6, color=colors, edgecolor="black", linewidth=0.3)
        for xi, v in zip(x, values, strict=True):
            ax.text(xi, v, f"{v:,.0f}", ha="center", va="bottom", fontsize=5.5)
        ax.set_xticks(x, [LABELS[n] for n in present], fontsize=5.5, rotation=35, ha="right")
    axes[1].set_ylabel("requests/s")
    axes[1].set_title("(b) 64 connections: requests/s", fontsize=8.5)
    axes[2].axhline(70, color="#c0392b", linewidth=0.7, linestyle="--")
    axes[2].set_ylabel("CPU µs per call")
    axes[2].set_title("(c) serving processes' CPU per call", fontsize=8.5)
else:
    for ax in axes:
        missing(ax, "floor_bench")
fig.tight_layout()
save(fig, "fig12_floor")

# %%
prov = (floor or {}).get("provenance") or {}
update_summary("floor", {
    "measured": bool(present),
    "timestamp": (floor or {}).get("timestamp"),
    "git_sha": prov.get("git_sha"),
    "quick": ((floor or {}).get("config") or {}).get("quick"),
    "workers": ((floor or {}).get("config") or {}).get("workers"),
    "runtime": ((floor or {}).get("config") or {}).get("runtime"),
    "loops_mapped": sorted({lib for pids in ((floor or {}).get("loops_mapped") or {}).values()
                            for libs in pids.values() for lib in libs}),
    "rows": {t: rows.get(t) for t in ["direct", *TARGETS] if t in rows},
    "goals": (floor or {}).get("goals"),
    "ok": (floor or {}).get("ok"),
})
