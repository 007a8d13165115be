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
# # Provenance of the run
# What the paper's setup section quotes: git sha, build profile, versions, CPU, workers, the mode,
# which scenarios ran and how long each took. Read from `RUN_DIR/run.json` (written by
# `bench/paper.py`) and each scenario's own provenance.

# %%
import json
import sys
from pathlib import Path

# NOTE: under Jupyter there is no __file__; the notebook runs from its own folder.
sys.path.insert(0, str(Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()))
from _common import load, run_dir, update_summary  # noqa: E402

RUN = run_dir()
record = json.loads((RUN / "run.json").read_text()) if (RUN / "run.json").exists() else {}
prov = record.get("provenance") or next(
    (d["provenance"] for d in (load(n) for n in ("proxy", "governance", "capacity", "models")) if d), {})

# %%
scenarios = {}
for name, sc in (record.get("scenarios") or {}).items():
    doc = load(name)
    scenarios[name] = {"rc": sc.get("rc"), "seconds": sc.get("seconds"), "ok": bool(doc and doc.get("ok", True)
                                                                                   and sc.get("rc") == 0),
                       "command": sc.get("command", "").replace(str(Path.cwd()) + "/", "")}
versions = prov.get("versions", {})
summary = {
    "run_dir": RUN.name,
    "timestamp": record.get("timestamp"),
    "mode": record.get("mode", "unknown"),
    "workers": record.get("workers"),
    "git_sha": (prov.get("git_sha") or "unknown")[:12],
    "git_dirty": prov.get("git_dirty"),
    "build_profile": prov.get("build_profile"),
    "cpu_model": (prov.get("cpu") or {}).get("model"),
    "cpu_count": (prov.get("cpu") or {}).get("affinity_count"),
    "kernel": (prov.get("host") or {}).get("kernel"),
    "versions": {k: versions.get(k) for k in ("python", "granian", "meshfast", "aiohttp", "msgspec", "wrk",
                                                "matplotlib", "typst")},
    "scenarios": scenarios,
    "scenarios_s": record.get("scenarios_s"),
    "command": record.get("command", "").replace(str(Path.cwd()) + "/", ""),
}
baselines = load("baselines")
if baselines:
    summary["baseline_versions"] = {n: b.get("version") or b.get("versions") for n, b in
                                    (baselines.get("baselines") or {}).items()}
update_summary("run", summary)
print(json.dumps(summary, indent=1))
