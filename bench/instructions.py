"""Instruction counts of the core's hot functions under callgrind, against a committed baseline.

Each workload of `core/examples/instructions.rs` runs fixed inputs, so a build's count is
deterministic: the gate can be tight (a count more than `--bound` above the baseline fails),
where a timing gate on a shared machine could not be.

    python bench/instructions.py            # check against bench/instructions-baseline.json
    python bench/instructions.py --update   # record the current counts as the baseline
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BASELINE = ROOT / "bench" / "instructions-baseline.json"
WORKLOADS = ("http1_parse", "sse_to_ndjson", "translate_request", "translate_stream", "key_lookup", "rule_decision",
             "dlp_scan")
# Only the instructions of the workload itself are counted (callgrind's --toggle-collect): by
# default everything `main` runs, so the dynamic loader's relocations (which grow with the binary,
# whatever the workload) stay out; a workload whose setup (building a large snapshot) would drown
# the measured function counts that function and what it calls.
TOGGLE_COLLECT = {"rule_decision": "*rules::decide*", "dlp_scan": "*dlp::Scanner::scan*"}
DEFAULT_TOGGLE = "instructions::main*"
BOUND = 1.02


def build() -> Path:
    subprocess.run(["cargo", "build", "--locked", "--release", "-q", "-p", "meshfast-core", "--example",
                    "instructions"], cwd=ROOT, check=True)
    return ROOT / "target" / "release" / "examples" / "instructions"


def count(binary: Path, workload: str) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        toggle = [f"--toggle-collect={TOGGLE_COLLECT.get(workload, DEFAULT_TOGGLE)}"]
        run = subprocess.run(["valgrind", "--tool=callgrind", *toggle, f"--callgrind-out-file={tmp}/out", str(binary),
                              workload], capture_output=True, text=True, check=True)
    match = re.search(r"Collected\s*:\s*(\d+)", run.stderr)
    if match is None:
        raise RuntimeError(f"no instruction count from callgrind:\n{run.stderr[-2000:]}")
    return int(match.group(1))


def run_header(argv: list[str] | None) -> dict:
    """The header every bench result opens with; the counts come from a `--release` build."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from bench import harness

    prov = harness.provenance(argparse.Namespace(meshfast_cmd="meshfast", only="hello"))
    prov["build_profile"], prov["build_profile_source"] = "release", "cargo build --release (this script)"
    prov["versions"]["valgrind"] = subprocess.run(["valgrind", "--version"], capture_output=True, text=True).stdout.strip()
    return harness.run_header(argv, dt.datetime.now(dt.UTC), prov)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--update", action="store_true")
    p.add_argument("--bound", type=float, default=BOUND)
    args = p.parse_args(argv)
    if shutil.which("valgrind") is None:
        print("valgrind is not installed", file=sys.stderr)
        return 2
    binary = build()
    counts = {w: count(binary, w) for w in WORKLOADS}
    if args.update:
        doc = {"bound": args.bound, "instructions": counts, **run_header(argv)}
        BASELINE.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {BASELINE}")
        return 0
    baseline = json.loads(BASELINE.read_text())["instructions"]
    failed = False
    print(f"{'workload':<20}{'baseline':>14}{'now':>14}{'ratio':>8}")
    for workload, now in counts.items():
        base = baseline[workload]
        ratio = now / base
        flag = "" if ratio <= args.bound else f"  > {args.bound}: REGRESSION"
        failed |= ratio > args.bound
        print(f"{workload:<20}{base:>14,}{now:>14,}{ratio:>8.3f}{flag}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
