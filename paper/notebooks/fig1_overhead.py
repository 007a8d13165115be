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
# # Figure 1: what meshfast adds per request
# (a) Time to last byte at 20 req/s, one target at a time (open loop, `proxy_bench.py`), p50/p95/p99
# per target: direct to testserve (grey) with the exact request meshfast sends, the bare forwarders
# (Granian + aiohttp, and Granian + meshfast's own upstream client), meshfast per provider family.
# (b) Added latency over direct of the same family (a difference of percentiles).
# (c) Max requests/s with wrk at 32 connections, and the other gateways measured in the same run on
# the same OpenAI chat request (`baseline_bench.py`).
# (d, e) The phase split, on meshfast's own clock (its `meshfast_request_phase_seconds` histograms,
# scraped before and after), at 20 req/s and under wrk: receiving the body from the HTTP server;
# auth, policy, rendering and admission (the Mesh write-up's phase 1 is these two); the upstream call
# with stream translation and the writes to the caller (its phase 2). Bars: p50/p90/p99, interpolated
# inside the histogram's buckets; dots: exact means.

# %%
import sys
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

# NOTE: under Jupyter there is no __file__; the notebook runs from its own folder.
sys.path.insert(0, str(Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()))
from _common import color, load, missing, ms, save, update_summary  # noqa: E402

proxy = load("proxy")
base = load("baselines")
PCTS = ("p50", "p95", "p99")

# %%
fig = plt.figure(figsize=(7.4, 7.6))
gs = fig.add_gridspec(3, 2, width_ratios=[1, 1.15])
axes = [fig.add_subplot(gs[0, :]), fig.add_subplot(gs[1, 0]), fig.add_subplot(gs[1, 1]),
        fig.add_subplot(gs[2, 0]), fig.add_subplot(gs[2, 1])]


def short(name: str) -> str:
    """direct-anthropic -> direct / anthropic, forwarder-native-anthropic -> fwd-native / anthropic."""
    head, _, family = name.rpartition("-")
    return f"{head.replace('forwarder', 'fwd')}\n{family}"


def pct_legend(ax) -> None:
    from matplotlib.patches import Patch

    ax.legend(handles=[Patch(facecolor="#555555", alpha=a, label=p) for p, a in zip(PCTS, (1.0, 0.7, 0.45),
                                                                                      strict=True)],
              ncol=3, loc="upper left")
summary: dict = {"measured": proxy is not None}
if proxy and proxy.get("latency"):
    lat = proxy["latency"]
    order = lat["order"]
    x = np.arange(len(order))
    w = 0.27
    for i, p in enumerate(PCTS):
        vals = [ms(lat["targets"][n]["total_us"].get(p)) or 0 for n in order]
        axes[0].bar(x + (i - 1) * w, vals, w, color=[color(n) for n in order], alpha=(1.0, 0.7, 0.45)[i],
                    edgecolor="black", linewidth=0.3, label=p)
    axes[0].set_xticks(x, [short(n) for n in order], fontsize=7)
    axes[0].set_ylabel("time to last byte (ms)")
    axes[0].set_title(f"(a) {lat['rate_rps']:g} req/s, {lat['duration_s_per_target']:g} s per target; bars p50/p95/p99")
    pct_legend(axes[0])
    added = [n for n in order if not n.startswith("direct")]
    x2 = np.arange(len(added))
    for i, p in enumerate(PCTS):
        vals = [lat["targets"][n].get("added_us", {}).get(p, 0) / 1000 for n in added]
        axes[1].bar(x2 + (i - 1) * w, vals, w, color=[color(n) for n in added], alpha=(1.0, 0.7, 0.45)[i],
                    edgecolor="black", linewidth=0.3)
    axes[1].axhline(0, color="black", linewidth=0.6)
    axes[1].set_xticks(x2, [short(n) for n in added], fontsize=6.5)
    axes[1].set_ylabel("added over direct (ms)")
    axes[1].set_title("(b) added latency, p50/p95/p99")
    summary["rate_rps"] = lat["rate_rps"]
    summary["duration_s_per_target"] = lat["duration_s_per_target"]
    summary["targets"] = {
        n: {"requests": r["requests"], **{p: ms(r["total_us"].get(p), 3) for p in PCTS},
            "added_ms": {p: ms(r.get("added_us", {}).get(p), 3) for p in PCTS} if "added_us" in r else None}
        for n, r in lat["targets"].items()}
    summary["cpu"] = lat["cpu"]
else:
    missing(axes[0], "proxy_bench latency")
    missing(axes[1], "proxy_bench latency")

# %%
bars: list[tuple[str, float, float, str]] = []  # (label, req/s, p99 ms, colour)
if proxy and proxy.get("throughput"):
    for n, r in proxy["throughput"]["runs"].items():
        bars.append((n.replace("-anthropic", " (proxy)").replace("forwarder", "fwd"), r["requests_per_s"],
                     r["latency_p99_ms"], color(n)))
    summary["throughput"] = {n: {"requests_per_s": r["requests_per_s"], "p50_ms": r["latency_p50_ms"],
                                 "p99_ms": r["latency_p99_ms"], "cpu_s": r["cpu"]["cpu_s"],
                                 "duration_s": round(r["wrk"]["duration_us"] / 1e6, 1)}
                             for n, r in proxy["throughput"]["runs"].items()}
    summary["rps_ratio_meshfast_over_forwarder"] = proxy["throughput"].get("ratio_meshfast_over_forwarder_rps")
    summary["rps_ratio_meshfast_over_forwarder_native"] = proxy["throughput"].get(
        "ratio_meshfast_over_forwarder_native_rps")
if base and base.get("throughput"):
    for n, r in base["throughput"]["runs"].items():
        if "requests_per_s" in r:
            bars.append((n.replace("-openai-chat", " (chat)"), r["requests_per_s"], r["latency_p99_ms"], color(n)))
if bars:
    y = np.arange(len(bars))
    axes[2].barh(y, [b[1] for b in bars], color=[b[3] for b in bars], edgecolor="black", linewidth=0.3)
    for yi, (_, rps, p99, _) in zip(y, bars, strict=True):
        axes[2].text(rps, yi, f" {rps:,.0f} (p99 {p99:.0f} ms)", va="center", fontsize=6.5)
    axes[2].set_yticks(y, [b[0] for b in bars], fontsize=7)
    axes[2].invert_yaxis()
    axes[2].set_xlabel("requests/s (wrk -c32, shared cores)")
    axes[2].set_xlim(0, max(b[1] for b in bars) * 1.6)
    axes[2].xaxis.set_major_formatter(lambda v, _: f"{v / 1000:g}k" if v else "0")
    axes[2].set_title("(c) max requests/s")
else:
    missing(axes[2], "wrk runs")
# %%
PHASES = ("receive", "gateway", "upstream")
splits = []  # (title, split)
if proxy and (proxy.get("latency") or {}).get("phase_split"):
    splits.append((f"(d) phases at {proxy['latency']['rate_rps']:g} req/s", proxy["latency"]["phase_split"]))
    summary["phase_split_open_loop"] = proxy["latency"]["phase_split"]
tp_split = ((proxy or {}).get("throughput") or {}).get("runs", {}).get("meshfast-anthropic", {}).get("phase_split")
if tp_split:
    splits.append((f"(e) phases under wrk -c{proxy['throughput']['connections']}", tp_split))
    summary["phase_split_wrk"] = tp_split
for ax, item in zip(axes[3:], splits + [None] * (2 - len(splits)), strict=True):
    if item is None:
        missing(ax, "phase histograms")
        continue
    title, split = item
    x = np.arange(len(PHASES))
    for i, p in enumerate(("p50", "p90", "p99")):
        ax.bar(x + (i - 1) * w, [split[ph][p] or 0 for ph in PHASES], w, color=color("meshfast"),
               alpha=(1.0, 0.7, 0.45)[i], edgecolor="black", linewidth=0.3)
    ax.plot(x, [split[ph]["mean_us"] or 0 for ph in PHASES], "o", color="black", markersize=3, label="mean")
    ax.set_yscale("log")
    ax.set_xticks(x, [f"{ph}\nmean {split[ph]['mean_us'] or 0:,.0f}" for ph in PHASES], fontsize=7)
    ax.set_ylabel("µs per request (log)")
    ax.set_title(f"{title} (n={split['upstream']['count']:,})")
    ax.legend(loc="upper left", fontsize=6.5)
fig.tight_layout()
save(fig, "fig1_overhead")

# %% [markdown]
# ## Every other data-plane endpoint (same run, same rate): embeddings, the standard chat routes, and
# the two routes that never call upstream

# %%
ep = (proxy or {}).get("endpoints")
if ep:
    fig, ax = plt.subplots(figsize=(7.4, 2.6))
    order = ep["order"]
    x = np.arange(len(order))
    w = 0.27
    for i, p in enumerate(PCTS):
        ax.bar(x + (i - 1) * w, [ms(ep["targets"][n]["total_us"].get(p)) or 0 for n in order], w,
               color=[color(n) for n in order], alpha=(1.0, 0.7, 0.45)[i], edgecolor="black", linewidth=0.3)
    ax.set_xticks(x, [n.replace("meshfast-", "meshfast\n").replace("direct-", "direct\n")
                      .replace("chat-completions", "chat/compl.") for n in order], fontsize=6.5)
    ax.set_ylabel("time to last byte (ms)")
    ax.set_title(f"Endpoints at {ep['rate_rps']:g} req/s, {ep['duration_s_per_target']:g} s per target; "
                 "bars p50/p95/p99")
    pct_legend(ax)
    fig.tight_layout()
    save(fig, "fig1_endpoints")
    summary["endpoints"] = {
        "rate_rps": ep["rate_rps"], "duration_s_per_target": ep["duration_s_per_target"],
        "targets": {n: {"requests": r["requests"], **{p: ms(r["total_us"].get(p), 3) for p in PCTS},
                        "added_ms": {p: ms(r["added_us"].get(p), 3) for p in PCTS} if "added_us" in r else None}
                    for n, r in ep["targets"].items()},
        "phase_split": ep.get("phase_split")}

# %% [markdown]
# ## The comparison with the other gateways (same run, same OpenAI chat request, same testserve)

# %%
if base and base.get("latency"):
    lat = base["latency"]
    tp = (base.get("throughput") or {}).get("runs", {})
    fig, axes = plt.subplots(1, 2, figsize=(8, 2.8))
    names = lat["order"]
    x = np.arange(len(names))
    w = 0.27
    for i, p in enumerate(PCTS):
        axes[0].bar(x + (i - 1) * w, [ms(lat["targets"][n]["total_us"].get(p)) or 0 for n in names], w,
                    color=[color(n) for n in names], alpha=(1.0, 0.7, 0.45)[i], edgecolor="black", linewidth=0.3,
                    label=p)
    axes[0].set_xticks(x, [n.replace("-openai-chat", "") for n in names], fontsize=7)
    axes[0].set_yscale("log")
    axes[0].set_ylabel("time to last byte (ms, log)")
    axes[0].set_title(f"(a) streamed chat at {lat['rate_rps']:g} req/s")
    pct_legend(axes[0])
    rps = [tp.get(n, {}).get("requests_per_s", 0) for n in names]
    axes[1].bar(x, rps, color=[color(n) for n in names], edgecolor="black", linewidth=0.3)
    for xi, v in zip(x, rps, strict=True):
        axes[1].text(xi, v, f"{v:,.0f}", ha="center", va="bottom", fontsize=6.5)
    axes[1].set_yscale("log")
    axes[1].set_xticks(x, [n.replace("-openai-chat", "") for n in names], fontsize=7)
    axes[1].set_ylabel("requests/s (wrk -c32, log)")
    axes[1].set_title("(b) max requests/s")
    fig.tight_layout()
    save(fig, "fig1_baselines")
    rows = {}
    for n in names:
        r = lat["targets"][n]
        rows[n] = {"requests": r["requests"], "errors": r["error_count"],
                   **{p: ms(r["total_us"].get(p), 3) for p in PCTS},
                   "added_ms": {p: ms(r.get("added_us", {}).get(p), 3) for p in PCTS} if "added_us" in r else None,
                   "requests_per_s": tp.get(n, {}).get("requests_per_s"),
                   "wrk_p99_ms": tp.get(n, {}).get("latency_p99_ms"),
                   "wrk_errors": tp.get(n, {}).get("errors_total")}
    update_summary("baselines", {"measured": True, "rate_rps": lat["rate_rps"], "targets": rows,
                                 "servers": {n: {k: v for k, v in b.items() if k != "url"}
                                             for n, b in (base.get("baselines") or {}).items()},
                                 "ok": base.get("ok"), "failures": [f[:300] for f in base.get("failures", [])]})
else:
    update_summary("baselines", {"measured": False,
                                 "servers": (base or {}).get("baselines"),
                                 "failures": [f[:300] for f in (base or {}).get("failures", [])]})

# %%
update_summary("overhead", summary)
