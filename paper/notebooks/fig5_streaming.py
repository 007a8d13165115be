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
# # Figure 5: streaming, rejection, connections
# (a) Time to first body byte against time to last byte per stream shape: a short anthropic stream
# and a `huge` one (about 200 deltas), through meshfast and direct, sequential requests
# (`proxy_bench.py`'s TTFB phase; every request is a point). (b) Unloaded latency, one request at a
# time at 20 req/s (`capacity_bench.py`'s probe): `/healthz`, authenticated `/v1/models` and the
# invalid-key 401 (rejection latency). (c) The same on a new TCP connection per request: the cost of
# a connection.

# %%
import sys
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

# NOTE: under Jupyter there is no __file__; the notebook runs from its own folder.
sys.path.insert(0, str(Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()))
from _common import color, load, missing, ms, save, update_summary  # noqa: E402

proxy = load("proxy")
cap = load("capacity")
fig, axes = plt.subplots(1, 3, figsize=(7.4, 2.7), gridspec_kw={"width_ratios": [1.3, 1, 1]})
summary: dict = {}

# %%
tt = (proxy or {}).get("ttfb")
if tt:
    markers = {"meshfast-anthropic": "o", "meshfast-anthropic-huge": "s", "direct-anthropic": "^",
               "direct-anthropic-huge": "D"}
    for name, r in tt["targets"].items():
        last = np.array(r.get("raw_total_us", [])) / 1000
        first = np.array(r.get("raw_ttfb_body_us", [])) / 1000
        axes[0].scatter(last, first, s=8, marker=markers.get(name, "o"), color=color(name), alpha=0.7,
                        label=name.replace("-anthropic", ""))
    lim = max(max(r.get("raw_total_us", [0])) for r in tt["targets"].values()) / 1000 * 1.05
    axes[0].plot([0, lim], [0, lim], ":", color="grey", linewidth=0.8)
    axes[0].set_xlabel("last byte (ms)")
    axes[0].set_ylabel("first body byte (ms)")
    axes[0].set_title("(a) TTFB vs last byte per stream")
    axes[0].legend(fontsize=6)
    summary["ttfb"] = {n: {"ttfb_p50_ms": ms(r["ttfb_body_us"].get("p50"), 3),
                           "last_byte_p50_ms": ms(r["service_us"].get("p50"), 3), "body_bytes": r["body_bytes"],
                           "count": r["requests"]} for n, r in tt["targets"].items()}
    summary["meshfast_huge_minus_short_ttfb_p50_ms"] = ms(tt.get("meshfast_huge_minus_short_ttfb_p50_us"), 3)
    summary["direct_huge_minus_short_ttfb_p50_ms"] = ms(tt.get("direct_huge_minus_short_ttfb_p50_us"), 3)
else:
    missing(axes[0], "proxy_bench TTFB")

# %%
probe = (cap or {}).get("probe")
if probe:
    runs = probe["runs"]
    for ax, mode, title in ((axes[1], "keepalive", "(b) kept-alive connection"),
                            (axes[2], "new_connection", "(c) new connection each")):
        names = [k for k, r in runs.items() if r["connection"] == mode]
        x = np.arange(len(names))
        for i, p in enumerate(("p50", "p99")):
            ax.bar(x + (i - 0.5) * 0.38, [ms(runs[n]["total_us"].get(p)) for n in names], 0.38,
                   color="#4e79a7" if p == "p50" else "#a0bcd8", edgecolor="black", linewidth=0.3, label=p)
        ax.set_xticks(x, [runs[n]["path"].replace("invalid_key", "401 bad key").replace("models", "/v1/models")
                          .replace("healthz", "/healthz") for n in names], fontsize=6.5)
        ax.set_ylabel("ms")
        ax.set_title(title)
        ax.legend(fontsize=6)
    ymax = max(ax.get_ylim()[1] for ax in axes[1:])
    for ax in axes[1:]:
        ax.set_ylim(0, ymax)
    summary["probe"] = {k: {"p50_ms": ms(r["total_us"].get("p50"), 3), "p99_ms": ms(r["total_us"].get("p99"), 3),
                            "statuses": r["statuses"]} for k, r in runs.items()}
    summary["probe_count"] = probe["count"]
    for path in ("healthz", "models", "invalid_key"):
        a, b = runs.get(f"{path}_keepalive"), runs.get(f"{path}_new_connection")
        if a and b:
            summary.setdefault("new_connection_cost_p50_ms", {})[path] = ms(
                b["total_us"]["p50"] - a["total_us"]["p50"], 3)
else:
    missing(axes[1], "capacity_bench probe")
    missing(axes[2], "capacity_bench probe")
fig.tight_layout()
save(fig, "fig5_streaming")
update_summary("streaming", summary)
