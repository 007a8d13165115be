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
# # Stability: the soak's memory and the flood's accounting
# (a) Worker RSS every second through the soak (`soak.py`: a fixed rotation of streams on three
# families, two entry routes, bad keys and unknown models, 32 pipelined connections), with the
# least-squares slope after 10 s of warm-up (the leak rate). (b) Answers by status. (c) The bad-key
# flood (`capacity_bench.py`): requests sent, 401s received, denials counted in `request_logs`
# (merged rows carry a count) and the rows that hold them.

# %%
import sys
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

# NOTE: under Jupyter there is no __file__; the notebook runs from its own folder.
sys.path.insert(0, str(Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()))
from _common import COLORS, load, missing, save, update_summary  # noqa: E402

soak = load("soak")
cap = load("capacity")
fig, axes = plt.subplots(1, 3, figsize=(7.4, 2.6), gridspec_kw={"width_ratios": [1.5, 1, 1]})
summary: dict = {}

# %%
res = (soak or {}).get("result")
if res:
    series = res["rss_mb_series"]
    t = np.array([s[0] for s in series])
    rss = np.array([s[1] for s in series])
    axes[0].plot(t, rss, "-", color=COLORS["meshfast"], linewidth=1)
    leak = res.get("leak_mb_per_min")
    if leak is not None:
        keep = t >= 10
        if keep.sum() >= 3:
            b = np.polyfit(t[keep], rss[keep], 1)
            axes[0].plot(t[keep], np.polyval(b, t[keep]), ":", color="#c0392b",
                         label=f"slope {leak:+.2f} MiB/min")
            axes[0].legend(fontsize=6.5)
    axes[0].set_xlabel("s into the soak")
    axes[0].set_ylabel("worker RSS (MiB, sum)")
    axes[0].set_title(f"(a) soak: {res['sent']:,} requests, {res['requests_per_s']:,.0f}/s")
    st = {str(k): v for k, v in res["statuses"].items()}
    keys = sorted(st)
    axes[1].bar(keys, [st[k] for k in keys], color=["#59a14f" if k.startswith("2") else "#e15759" for k in keys],
                edgecolor="black", linewidth=0.3)
    for i, k in enumerate(keys):
        axes[1].text(i, st[k], f"{st[k]:,}", ha="center", va="bottom", fontsize=6)
    axes[1].set_xlabel("status")
    axes[1].set_ylabel("answers")
    axes[1].set_title("(b) soak answers")
    rows = soak.get("rows") or {}
    summary["soak"] = {"requests": res["sent"], "seconds": res["seconds"], "requests_per_s": res["requests_per_s"],
                       "statuses": st, "socket_errors": res["errors"], "rss_mb_start": res["rss_mb_start"],
                       "rss_mb_end": res["rss_mb_end"], "rss_mb_max": round(float(rss.max()), 1) if len(rss) else None,
                       "leak_mb_per_min": leak, "rows_expected": rows.get("expected"),
                       "rows_logged": rows.get("logged"), "rows_ok": rows.get("ok"),
                       "config": soak.get("config"), "telemetry": soak.get("telemetry")}
else:
    missing(axes[0], "soak")
    missing(axes[1], "soak")

# %%
fl = (cap or {}).get("flood")
if fl:
    tel = fl["telemetry"]
    bars = [("sent", fl["sent"]), ("401s", int(fl["statuses"].get("401", 0))),
            ("logged", tel["denials_logged"]), ("rows", tel["rows"])]
    axes[2].bar([b[0] for b in bars], [b[1] for b in bars], color=["#9e9e9e", "#e15759", "#4e79a7", "#86a6c9"],
                edgecolor="black", linewidth=0.3)
    for i, (_, v) in enumerate(bars):
        axes[2].text(i, v, f"{v:,}", ha="center", va="bottom", fontsize=6)
    axes[2].tick_params(axis="x", labelsize=6.5)
    axes[2].set_title(f"(c) bad-key flood: {tel['lost']:,} lost")
    summary["flood"] = {"requests": fl["requests"], "sent": fl["sent"], "statuses": fl["statuses"],
                        "seconds": fl["seconds"], "requests_per_s": fl["requests_per_s"],
                        "socket_errors": fl["socket_errors"], "denials_logged": tel["denials_logged"],
                        "rows": tel["rows"], "lost": tel["lost"], "ok": tel["ok"], "healthz_after": fl["healthz_after"],
                        "telemetry": fl.get("telemetry_counters")}
else:
    missing(axes[2], "capacity_bench flood")
fig.tight_layout()
save(fig, "fig6_soak_flood")
update_summary("stability", summary)
