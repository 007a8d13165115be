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
# # The two paced soaks
# Mixed `POST /v1/proxy` over three providers limited to 50 req/s each (`soak_paced.py`), open loop:
# under capacity (140 req/s) and over it (200 req/s). (a) Per second: 200s, 503s and the p50 of the
# 200s. (b) RSS of meshfast's processes through each stage.

# %%
import sys
from pathlib import Path

import matplotlib.pyplot as plt

# NOTE: under Jupyter there is no __file__; the notebook runs from its own folder.
sys.path.insert(0, str(Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()))
from _common import COLORS, load, missing, save, update_summary  # noqa: E402

doc = load("soak_paced")
fig, axes = plt.subplots(1, 2, figsize=(7.4, 2.6), gridspec_kw={"width_ratios": [1.6, 1]})
summary: dict = {"measured": bool(doc and doc.get("stages"))}

# %%
if doc and doc.get("stages"):
    offset = 0.0
    ax2 = axes[0].twinx()
    ax2.spines["right"].set_visible(True)
    for i, st in enumerate(doc["stages"]):
        ps = st["per_second"]
        t = [offset + p["s"] for p in ps]
        axes[0].plot(t, [p["ok"] for p in ps], "-", color="#59a14f", linewidth=1, label="200/s" if i == 0 else None)
        axes[0].plot(t, [p["shed_503"] for p in ps], "-", color="#e15759", linewidth=1,
                     label="503/s" if i == 0 else None)
        ax2.plot(t, [p["ok_p50_ms"] for p in ps], ":", color=COLORS["meshfast"], linewidth=1,
                 label="p50 of 200s" if i == 0 else None)
        axes[0].axvline(offset, color="grey", linewidth=0.5)
        axes[0].text(offset + 1, 5, f"{st['rate_rps']:g} req/s", fontsize=6.5)
        r = st["rss_mb_series"]
        axes[1].plot([offset + x[0] for x in r], [x[1] for x in r], "-", color=COLORS["meshfast"], linewidth=1)
        offset += st["duration_s"] + 2
    ax2.set_yscale("log")
    ax2.set_ylabel("p50 of 200s (ms)", color=COLORS["meshfast"])
    axes[0].set_xlabel("s (stages back to back)")
    axes[0].set_ylabel("answers per arrival second")
    axes[0].legend(loc="upper left", fontsize=6)
    axes[0].set_title("(a) paced soaks: answers and latency")
    axes[1].set_xlabel("s")
    axes[1].set_ylabel("RSS (MiB)")
    axes[1].set_title("(b) RSS")
    summary["rps_limit"] = doc["config"]["rps_limit"]
    summary["stages"] = [{"rate_rps": st["rate_rps"], "duration_s": st["duration_s"], "requests": st["requests"],
                          "success_share": st["success_share"], "shed_share": st["shed_share"],
                          "p50_ms": st["latency_ok_ms"].get("p50"), "p99_ms": st["latency_ok_ms"].get("p99"),
                          "max_ms": st["latency_ok_ms"].get("max"), "served_rps": st["served_rps"],
                          "rss_mb_start": st["rss_mb_start"], "rss_mb_peak": st["rss_mb_peak"],
                          "rss_mb_end": st["rss_mb_end"], "leak_mb_per_min": st["leak_mb_per_min"],
                          "errors": st["error_count"]} for st in doc["stages"]]
    summary["ok"] = doc.get("ok")
    summary["telemetry"] = doc.get("telemetry")
    summary["requests"] = sum(st["requests"] for st in doc["stages"])
else:
    missing(axes[0], "soak_paced")
    missing(axes[1], "soak_paced")
fig.tight_layout()
save(fig, "fig7_paced_soak")
update_summary("paced_soak", summary)
