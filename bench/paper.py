"""The paper pipeline: run every scenario, draw the figures from the raw JSON, build the PDF.

    python bench/paper.py                  # full run (~25 min on 2 cores): bench/results/paper-<ts>/
    python bench/paper.py --quick          # everything shortened (a few minutes; CI)
    python bench/paper.py --only proxy     # one scenario (repeatable), then figures and PDF
    python bench/paper.py --figures-only bench/results/paper-<ts>   # redraw and rebuild from a run

Scenarios are data (`bench/scenarios.json`): a name, a script and its arguments per mode. Each script
starts what it needs and stops it; the runner passes `--out RUN_DIR/NAME.json` and keeps each
script's output in `RUN_DIR/NAME.log`. `RUN_DIR/run.json` holds the provenance of the whole run (git
sha and dirty flag, build profile, versions, CPU model and count, workers, the command of the run and
of every scenario, exit codes, durations, what was installed for the baselines). Then every notebook
in `paper/notebooks/` (jupytext percent-format `.py`, run with this Python) reads RUN_DIR and writes
its figures to `figures/` and its numbers to `data/summary.json`, and `paper/meshfast.typ` is
compiled to `meshfast.pdf` with the `typst` package, all under `paper/` for a full run (or
`--figures-only`), under `RUN_DIR/paper/` for `--quick` and `--only` runs, so that a smoke run never
replaces the paper's figures (`--paper-out` chooses).

Exit status: 0 when every scenario, notebook and the PDF succeeded; 1 otherwise (the PDF is still
built from what exists, and says what is missing).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import harness  # noqa: E402

SCENARIOS = ROOT / "bench" / "scenarios.json"
RESULTS_DIR = ROOT / "bench" / "results"
PAPER_DIR = ROOT / "paper"
NOTEBOOKS_DIR = PAPER_DIR / "notebooks"
TYPST_SOURCE = PAPER_DIR / "meshfast.typ"
PDF = PAPER_DIR / "meshfast.pdf"
# A scenario that runs past this is stopped (its process group); the JSON it wrote so far is kept.
SCENARIO_TIMEOUT_S = {"full": 3600, "quick": 600}
NOTEBOOK_TIMEOUT_S = 300


def load_scenarios() -> list[dict]:
    return json.loads(SCENARIOS.read_text())["scenarios"]


def scenario_argv(sc: dict, mode: str, run_dir: Path, args) -> list[str]:
    subst = {"{meshfast}": args.meshfast_cmd, "{workers}": str(args.workers)}
    rest = [subst.get(a, a) for a in sc[mode]]
    return [sys.executable, str(ROOT / sc["script"]), *rest, "--out", str(run_dir / f"{sc['name']}.json")]


def run_logged(argv: list[str], log_path: Path, timeout_s: float, env: dict | None = None) -> dict:
    """Runs argv in its own session, output to log_path (and a line per start/end on stdout)."""
    t0 = time.monotonic()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            # SIGTERM first: the bench scripts stop their servers on it.
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            rc, timed_out = proc.returncode, True
        except KeyboardInterrupt:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=90)
            raise
    return {"rc": rc, "timed_out": timed_out, "seconds": round(time.monotonic() - t0, 1)}


def install_baselines(run_dir: Path, names: list[str]) -> dict:
    from bench.baselines import install

    print(f"[paper] installing baselines {', '.join(names)} (bench/baselines/) ...", flush=True)
    t0 = time.monotonic()
    report = {}
    if "litellm" in names:
        report["litellm"] = install.install_litellm()
    if "portkey" in names:
        report["portkey"] = install.install_portkey()
    report["seconds"] = round(time.monotonic() - t0, 1)
    (run_dir / "baselines-install.json").write_text(json.dumps(report, indent=1) + "\n")
    return report


def run_scenarios(args, run_dir: Path, record: dict) -> bool:
    mode = "quick" if args.quick else "full"
    chosen = [sc for sc in load_scenarios() if not args.only or sc["name"] in args.only]
    unknown = set(args.only or []) - {sc["name"] for sc in load_scenarios()}
    if unknown:
        raise SystemExit(f"unknown scenario(s): {', '.join(sorted(unknown))}")
    needs = sorted({n for sc in chosen for n in sc.get("needs", [])})
    if needs and not args.no_install:
        record["baselines_install"] = install_baselines(run_dir, needs)
    ok = True
    for sc in chosen:
        argv = scenario_argv(sc, mode, run_dir, args)
        print(f"[paper] {sc['name']}: {shlex.join(argv[1:])}", flush=True)
        res = run_logged(argv, run_dir / f"{sc['name']}.log", SCENARIO_TIMEOUT_S[mode])
        res.update({"command": shlex.join(argv), "script": sc["script"], "mode": mode,
                    "result": f"{sc['name']}.json" if (run_dir / f"{sc['name']}.json").exists() else None})
        record["scenarios"][sc["name"]] = res
        (run_dir / "run.json").write_text(json.dumps(record, indent=1) + "\n")
        state = "ok" if res["rc"] == 0 else f"FAILED rc={res['rc']}" + (" (timed out)" if res["timed_out"] else "")
        print(f"[paper] {sc['name']}: {state} in {res['seconds']:.0f} s "
              f"(log {run_dir / (sc['name'] + '.log')})", flush=True)
        ok = ok and res["rc"] == 0
    return ok


def draw(run_dir: Path, out_dir: Path, record: dict | None = None) -> bool:
    """Runs every notebook against run_dir into out_dir, then compiles the Typst source there."""
    (out_dir / "figures").mkdir(parents=True, exist_ok=True)
    (out_dir / "data").mkdir(parents=True, exist_ok=True)
    summary = out_dir / "data" / "summary.json"
    # NOTE: rebuilt from scratch: a section a notebook did not write must not survive from an older run.
    summary.write_text(json.dumps({"run_dir": str(run_dir.relative_to(ROOT) if run_dir.is_relative_to(ROOT)
                                                   else run_dir)}, indent=1) + "\n")
    env = dict(os.environ, PAPER_RUN_DIR=str(run_dir), PAPER_OUT_DIR=str(out_dir), MPLBACKEND="Agg",
               PYTHONSAFEPATH="1")
    ok = True
    notebooks = {}
    for nb in sorted(NOTEBOOKS_DIR.glob("[0-9a-z]*.py")):
        if nb.name.startswith("_"):
            continue
        res = run_logged([sys.executable, str(nb), str(run_dir)], run_dir / f"notebook-{nb.stem}.log",
                         NOTEBOOK_TIMEOUT_S, env)
        notebooks[nb.stem] = res
        state = "ok" if res["rc"] == 0 else f"FAILED rc={res['rc']} (see {run_dir / ('notebook-' + nb.stem + '.log')})"
        print(f"[paper] notebook {nb.stem}: {state}", flush=True)
        ok = ok and res["rc"] == 0
    pdf_ok = build_pdf(run_dir, out_dir)
    if record is not None:
        record["notebooks"] = notebooks
        record["pdf"] = {"ok": pdf_ok, "path": str(out_dir / PDF.name)}
    return ok and pdf_ok


def build_pdf(run_dir: Path, out_dir: Path) -> bool:
    try:
        import typst
    except ImportError as exc:
        print(f"[paper] typst is not installed ({exc}); no PDF", file=sys.stderr)
        return False
    source = TYPST_SOURCE
    if out_dir.resolve() != PAPER_DIR.resolve():
        # The source reads figures/ and data/ beside it: compile a copy next to this run's outputs.
        source = out_dir / TYPST_SOURCE.name
        shutil.copyfile(TYPST_SOURCE, source)
    pdf = out_dir / PDF.name
    try:
        typst.compile(str(source), output=str(pdf), root=str(out_dir))
    except Exception as exc:  # noqa: BLE001 - typst raises its own error types; report any
        (run_dir / "typst.log").write_text(str(exc))
        print(f"[paper] typst failed: {str(exc)[:2000]}", file=sys.stderr)
        return False
    print(f"[paper] wrote {pdf} ({pdf.stat().st_size // 1024} KiB)", flush=True)
    return True


def provenance(args) -> dict:
    return harness.provenance(argparse.Namespace(meshfast_cmd=args.meshfast_cmd, only=None),
                              ("aiohttp", "matplotlib", "typst", "jupytext", "psutil", "asyncpg"))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="every scenario shortened (a few minutes; CI)")
    p.add_argument("--only", action="append", metavar="NAME", help="run this scenario only (repeatable)")
    p.add_argument("--figures-only", type=Path, metavar="RUN_DIR", help="redraw figures and the PDF from a run")
    p.add_argument("--no-figures", action="store_true", help="run the scenarios only")
    p.add_argument("--no-install", action="store_true", help="do not install the baselines (skipped if absent)")
    p.add_argument("--workers", type=int, default=2, help="Granian workers for meshfast and the forwarders")
    p.add_argument("--meshfast-cmd", default=harness.default_meshfast_cmd())
    p.add_argument("--run-dir", type=Path, help="where to write (default bench/results/paper-<timestamp>[-quick])")
    p.add_argument("--paper-out", type=Path, help="where figures, data/summary.json and the PDF go (default: "
                   "paper/ for a full run and --figures-only, RUN_DIR/paper for --quick and --only)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.figures_only:
        run_dir = args.figures_only.resolve()
        if not run_dir.is_dir():
            raise SystemExit(f"no such run directory: {run_dir}")
        return 0 if draw(run_dir, (args.paper_out or PAPER_DIR).resolve()) else 1
    started = dt.datetime.now(dt.UTC)
    stamp = started.strftime("%Y%m%dT%H%M%SZ")
    run_dir = (args.run_dir or RESULTS_DIR / f"paper-{stamp}{'-quick' if args.quick else ''}").resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    record: dict = {
        "pipeline": "paper",
        **harness.run_header(argv, started, provenance(args)),
        "mode": "quick" if args.quick else "full",
        "workers": args.workers,
        "only": args.only,
        "nofile": harness.raise_nofile(),
        "scenarios": {},
    }
    (run_dir / "run.json").write_text(json.dumps(record, indent=1) + "\n")
    print(f"[paper] run directory {run_dir}", flush=True)
    ok = False
    try:
        ok = run_scenarios(args, run_dir, record)
    finally:
        record["scenarios_s"] = round((dt.datetime.now(dt.UTC) - started).total_seconds(), 1)
        (run_dir / "run.json").write_text(json.dumps(record, indent=1) + "\n")
    if not args.no_figures:
        # NOTE: a shortened or partial run must not replace the paper's committed figures and numbers.
        default_out = run_dir / "paper" if (args.quick or args.only) else PAPER_DIR
        ok = draw(run_dir, (args.paper_out or default_out).resolve(), record) and ok
    record["total_s"] = round((dt.datetime.now(dt.UTC) - started).total_seconds(), 1)
    record["ok"] = ok
    (run_dir / "run.json").write_text(json.dumps(record, indent=1) + "\n")
    print(f"[paper] {'done' if ok else 'done with FAILURES'} in {record['total_s']:.0f} s; run {run_dir}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    sys.exit(main())
