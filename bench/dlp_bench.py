"""Data protection (issue "DLP", "Speed"): the scanner's throughput in process on a named corpus.

`bench/dlp-corpus.txt`: 64 KiB of prose with 16 kinds of sensitive values and 16 kinds of near
misses mixed in (the same corpus `make instructions` counts, workload `dlp_scan`). Each round scans
it whole with every built-in detector through `meshfast._core.dlp_scan` (the GIL released); the
result is MB/s at the median and the fastest round, and the matches found per detector.

    .venv/bin/python bench/dlp_bench.py            # ~10 s
    .venv/bin/python bench/dlp_bench.py --quick    # ~2 s
"""

from __future__ import annotations

import argparse
import collections
import datetime as dt
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import models_bench as mb  # noqa: E402
from meshfast._core import dlp_scan  # noqa: E402

CORPUS = ROOT / "bench" / "dlp-corpus.txt"
RESULTS_DIR = ROOT / "bench" / "results"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rounds = 30 if args.quick else args.rounds
    started = dt.datetime.now(dt.UTC)
    text = CORPUS.read_text()
    size = len(text.encode())
    dlp_scan(text)  # builds the scanner
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        found = dlp_scan(text)
        times.append(time.perf_counter() - t0)
    by_detector = collections.Counter(d for d, _, _ in found)
    doc = {**mb.run_header(sys.argv[1:], started, {"corpus": str(CORPUS.relative_to(ROOT)), "bytes": size}),
           "rounds": rounds,
           "mb_per_s": {"median": round(size / statistics.median(times) / 1e6, 1),
                        "best": round(size / min(times) / 1e6, 1)},
           "scan_ms": {"median": round(statistics.median(times) * 1000, 3), "best": round(min(times) * 1000, 3)},
           "matches": dict(sorted(by_detector.items()))}
    out = args.out or RESULTS_DIR / f"dlp-{dt.datetime.now(dt.UTC):%Y%m%dT%H%M%SZ}.json"

    def show(d: dict) -> None:
        print(f"corpus {size:,} bytes: {d['mb_per_s']['median']} MB/s median, {d['mb_per_s']['best']} MB/s best "
              f"({d['scan_ms']['median']} ms a scan); matches {d['matches']}")

    return mb.finish(doc, [], started, out, "dlp", show)


if __name__ == "__main__":
    sys.exit(main())
