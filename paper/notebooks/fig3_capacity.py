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
# # Figure 3: raw capacity
# Paths without a provider limiter, wrk on the same cores (`capacity_bench.py`): `/healthz` (the
# middleware floor), authenticated `/v1/models`, an invalid key answered 401, and the held-connection
# runs (all connections opened at once). (b) `/v1/models` against a Granian hello-world answering the
# same body size (`models_bench.py`): the share of the ceiling meshfast keeps.

# %%
import sys
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

# NOTE: under Jupyter there is no __file__; the notebook runs from its own folder.
sys.path.insert(0, str(Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()))
from _common import COLORS, load, missing, save, update_summary  # noqa: E402

cap = load("capacity")
models = load("models")
fig, axes = plt.subplots(1, 2, figsize=(7.4, 3.0), gridspec_kw={"width_ratios": [1.8, 1]})
summary: dict = {"measured": bool(cap and cap.get("runs"))}

# %%
LABELS = {"healthz": "/healthz", "models": "/v1/models (key)", "invalid_key": "invalid key → 401"}


def label(name: str, run: dict) -> str:
    if name.startswith("held_"):
        kind = "/healthz" if "healthz" in name else "/v1/models"
        return f"{kind}\n{run['connections']:,} held"
    return f"{LABELS.get(name, name)}\n{run['connections']} conns"


if cap and cap.get("runs"):
    runs = cap["runs"]
    names = list(runs)
    y = np.arange(len(names))
    rps = [runs[n]["requests_per_s"] for n in names]
    cols = [COLORS["meshfast"] if not n.startswith("held_") else "#86a6c9" for n in names]
    axes[0].barh(y, rps, color=cols, edgecolor="black", linewidth=0.3)
    for yi, n in zip(y, names, strict=True):
        r = runs[n]
        errs = sum(r["socket_errors"].values())
        axes[0].text(r["requests_per_s"], yi, f" {r['requests_per_s']:,.0f}/s, p99 {r['latency_p99_ms']:.0f} ms"
                     + (f", {errs:,} socket errors" if errs else ", 0 errors"), va="center", fontsize=6.5)
    axes[0].set_yticks(y, [label(n, runs[n]) for n in names], fontsize=7)
    axes[0].invert_yaxis()
    axes[0].set_xlim(0, max(rps) * 1.9)
    axes[0].set_xlabel("requests/s (wrk, shared cores)")
    axes[0].set_title(f"(a) meshfast, {cap['config']['workers']} workers")
    summary["runs"] = {n: {"connections": r["connections"], "requests_per_s": r["requests_per_s"],
                           "p50_ms": r["latency_p50_ms"], "p99_ms": r["latency_p99_ms"],
                           "socket_errors": sum(r["socket_errors"].values()), "status_errors": r["status_errors"],
                           "requests": r["wrk"]["requests"], "peak_rss_mb": r["resources"]["peak_rss_mb"],
                           "peak_sockets": r["resources"]["peak_sockets"],
                           "cpu_s": r["cpu"]["cpu_s"], "machine_busy_pct": r["cpu"]["machine_busy_pct"]}
                       for n, r in runs.items()}
    summary["workers"] = cap["config"]["workers"]
    summary["nofile"] = cap["config"]["nofile"]["after"]
    summary["somaxconn"] = cap["config"].get("somaxconn")
    summary["ok"] = cap.get("ok")
else:
    missing(axes[0], "capacity_bench")

# %%
if models and models.get("summary"):
    sm = models["summary"]
    names = [n for n in ("hello", "meshfast") if n in sm]
    rounds = {n: [r["requests_per_s"] for r in models["runs"] if r["target"] == n and "requests_per_s" in r]
              for n in names}
    axes[1].bar(names, [sm[n]["requests_per_s_mean"] for n in names],
                color=[COLORS["hello"], COLORS["meshfast"]][:len(names)], edgecolor="black", linewidth=0.3)
    for i, n in enumerate(names):
        axes[1].plot([i] * len(rounds[n]), rounds[n], "k.", markersize=4)
    axes[1].set_ylabel("requests/s (mean of rounds; dots: rounds)")
    ratio = models.get("ratio_meshfast_over_hello_rps")
    axes[1].set_title(f"(b) /v1/models vs hello-world\nratio {ratio}" if ratio else "(b) /v1/models vs hello-world")
    summary["models_vs_hello"] = {"ratio": ratio, "rounds": models["config"]["rounds"],
                                  "connections": models["config"]["connections"],
                                  **{n: {"requests_per_s": sm[n]["requests_per_s_mean"],
                                         "p99_ms": sm[n]["latency_p99_ms_median"]} for n in names}}
else:
    missing(axes[1], "models_bench")
fig.tight_layout()
save(fig, "fig3_capacity")
update_summary("capacity", summary)
