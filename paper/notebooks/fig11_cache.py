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
# # Figure 11: prompt-cache shaping
# `cache_bench.py`: one multi-turn agent trace (OpenAI Chat format, a 1,500-token system prompt,
# 12 tools, a tool result per turn) against testserve's emulated prompt cache, with meshfast's
# shaping and without it (`X-Meshfast-Cache: off`). (a) What the trace cost, per arm, from the rows.
# (b) Its prompt tokens by class: read from the cache, written to it, neither.

# %%
import sys
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

# NOTE: under Jupyter there is no __file__; the notebook runs from its own folder.
sys.path.insert(0, str(Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()))
from _common import COLORS, load, missing, save, update_summary  # noqa: E402

cache = load("cache")
arms = (cache or {}).get("arms") or []
fig, axes = plt.subplots(1, 2, figsize=(8.2, 2.6))
SHAPED, PLAIN = COLORS["meshfast"], COLORS["direct"]

# %%
if arms:
    labels = [a["arm"].replace(" shaped", "\nshaped").replace(" unshaped", "\nunshaped") for a in arms]
    x = np.arange(len(arms))
    ax = axes[0]
    ax.bar(x, [a["cost_usd"] for a in arms], 0.6, color=[PLAIN if "unshaped" in a["arm"] else SHAPED for a in arms],
           edgecolor="black", linewidth=0.3)
    ax.set_xticks(x, labels, fontsize=6)
    ax.set_ylabel("USD for the trace")
    ax.set_title(f"(a) cost of {arms[0]['turns']} turns", fontsize=8.5)
    ax = axes[1]
    read = np.array([a["cache_read_tokens"] for a in arms])
    write = np.array([a["cache_write_tokens"] for a in arms])
    plain = np.array([a["uncached_prompt_tokens"] for a in arms])
    ax.bar(x, read / 1000, 0.6, color=SHAPED, label="read from the cache")
    ax.bar(x, write / 1000, 0.6, bottom=read / 1000, color="#a0cbe8", label="written to it")
    ax.bar(x, plain / 1000, 0.6, bottom=(read + write) / 1000, color=PLAIN, label="uncached")
    for i, a in enumerate(arms):
        ax.text(i, (read[i] + write[i] + plain[i]) / 1000, f"{a['hit_rate']:.0%}", ha="center", va="bottom",
                fontsize=6)
    ax.set_xticks(x, labels, fontsize=6)
    ax.set_ylabel("prompt tokens (thousands)")
    ax.set_title("(b) prompt tokens by class (hit rate above)", fontsize=8.5)
    ax.legend(fontsize=5.5, loc="upper right")
else:
    for ax in axes:
        missing(ax, "cache_bench")
fig.tight_layout()
save(fig, "fig11_cache")

# %%
by = {a["arm"]: a for a in arms}
update_summary("cache", {
    "measured": bool(arms),
    "timestamp": (cache or {}).get("started_at"),
    "turns": arms[0]["turns"] if arms else None,
    "arms": [{k: a[k] for k in ("arm", "cost_usd", "prompt_tokens", "cache_read_tokens", "cache_write_tokens",
                                "hit_rate")} for a in arms],
    **{k: round(v * 100, 1) for k, v in ((cache or {}).get("summary") or {}).items()},
})
