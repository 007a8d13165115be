"""What every notebook shares: where the run is, how to read it, where figures and numbers go.

Notebooks only read a run directory (bench/paper.py's `RUN_DIR`, given as argv[1] or
`PAPER_RUN_DIR`; the newest `bench/results/paper-*` otherwise) and write `figures/*.svg` and their
section of `data/summary.json` under `PAPER_OUT_DIR` (default `paper/`). They never start a server
or measure anything.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
# NOTE: bench/paper.py points quick runs elsewhere, so a CI smoke run never replaces the paper's figures.
OUT = Path(os.environ.get("PAPER_OUT_DIR") or ROOT / "paper").resolve()
FIGURES = OUT / "figures"
SUMMARY = OUT / "data" / "summary.json"

# One palette for every figure: direct is grey (as in the Mesh write-up), meshfast is blue.
COLORS = {
    "direct": "#9e9e9e", "forwarder": "#f28e2b", "forwarder-native": "#edc948", "meshfast": "#4e79a7",
    "litellm": "#e15759", "portkey": "#76b7b2", "hello": "#9e9e9e",
}

plt.rcParams.update({
    "figure.dpi": 110, "font.size": 8.5, "axes.titlesize": 9, "axes.labelsize": 8.5, "legend.fontsize": 7.5,
    "axes.spines.top": False, "axes.spines.right": False, "svg.fonttype": "none", "svg.hashsalt": "meshfast",
    "axes.grid": True, "grid.alpha": 0.3, "grid.linewidth": 0.5,
})


def run_dir() -> Path:
    arg = sys.argv[1] if len(sys.argv) > 1 and not sys.argv[1].startswith("-") else os.environ.get("PAPER_RUN_DIR")
    if arg:
        return Path(arg).resolve()
    runs = sorted((ROOT / "bench" / "results").glob("paper-*"))
    if not runs:
        raise SystemExit("no run directory: pass one, or run bench/paper.py first")
    return runs[-1]


def load(name: str) -> dict | None:
    """RUN_DIR/NAME.json, or None when the scenario did not run (the figure says so)."""
    path = run_dir() / f"{name}.json"
    if not path.exists():
        return None
    return json.loads(path.read_text())


def color(target: str) -> str:
    for key in ("forwarder-native", "forwarder", "direct", "meshfast", "litellm", "portkey", "hello"):
        if target.startswith(key):
            return COLORS[key]
    return "#bab0ac"


def save(fig, name: str) -> Path:
    FIGURES.mkdir(parents=True, exist_ok=True)
    path = FIGURES / f"{name}.svg"
    fig.savefig(path, bbox_inches="tight", metadata={"Date": None})
    if os.environ.get("PAPER_PREVIEW_DIR"):  # a PNG beside, for looking at a figure without a browser
        fig.savefig(Path(os.environ["PAPER_PREVIEW_DIR"]) / f"{name}.png", bbox_inches="tight", dpi=110)
    plt.close(fig)
    print(f"wrote {path}")
    return path


def missing(ax, what: str) -> None:
    """An empty panel that says which scenario is missing, instead of a silently absent figure."""
    ax.text(0.5, 0.5, f"not measured in this run:\n{what}", ha="center", va="center", transform=ax.transAxes,
            fontsize=8, color="#c0392b")
    ax.set_xticks([])
    ax.set_yticks([])


def update_summary(section: str, data: dict) -> None:
    SUMMARY.parent.mkdir(parents=True, exist_ok=True)
    doc = json.loads(SUMMARY.read_text()) if SUMMARY.exists() else {}
    doc[section] = data
    SUMMARY.write_text(json.dumps(doc, indent=1, sort_keys=False) + "\n")
    print(f"updated {SUMMARY} [{section}]")


def ms(us: float | None, digits: int = 2) -> float | None:
    return None if us is None else round(us / 1000, digits)
