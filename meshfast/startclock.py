"""How long a start took, and how much of it was the database's.

One clock runs from the moment the ``meshfast serve`` process began (the kernel's record of it, so
the interpreter's own start and the imports count) to each worker's readiness. The supervisor times
its phases (the embedded PostgreSQL's start, migrations, the counter seed, registration) and hands
them to the workers in ``MESHFAST_START``; each worker adds its own (pools, the snapshot's read,
build and load) and logs one line when it is ready::

    start: worker 4242 ready 1.84 s after serve began (database 1.10 s, meshfast 0.74 s): ...

A phase marked as the database's is time spent waiting on PostgreSQL; everything else is the
gateway's own start.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator

ENV = "MESHFAST_START"


def process_began() -> float:
    """When this process began (Unix seconds, to the kernel's clock tick), else now."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        now = time.time()
        # NOTE: both count from boot (the start time in clock ticks): how long ago this process
        # began, to a hundredth of a second (/proc/stat's btime is whole seconds).
        age = uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK")
        return now - max(0.0, age)
    except (OSError, ValueError, IndexError):
        return time.time()


class StartClock:
    def __init__(self, began: float | None = None, phases: list[tuple[str, float, bool]] | None = None) -> None:
        self.began = process_began() if began is None else began
        self.phases: list[tuple[str, float, bool]] = list(phases or [])

    @contextlib.contextmanager
    def phase(self, name: str, database: bool = False) -> Iterator[None]:
        started = time.monotonic()
        try:
            yield
        finally:
            self.phases.append((name, time.monotonic() - started, database))

    def add(self, name: str, seconds: float, database: bool = False) -> None:
        self.phases.append((name, seconds, database))

    def to_env(self) -> str:
        return json.dumps({"began": self.began, "phases": self.phases})

    @classmethod
    def from_env(cls) -> StartClock:
        """The supervisor's clock as it handed it over, or a clock of this process alone."""
        try:
            raw = json.loads(os.environ.get(ENV) or "null")
            return cls(float(raw["began"]), [(str(n), float(s), bool(d)) for n, s, d in raw["phases"]])
        except (TypeError, ValueError, KeyError):
            return cls()

    def report(self, what: str) -> dict[str, object]:
        """``what`` happened now: the elapsed time since the start, split into the database's part
        and the rest, with every phase."""
        total = time.time() - self.began
        database = sum(s for _, s, d in self.phases if d)
        return {"what": what, "total_s": round(total, 3), "database_s": round(database, 3),
                "own_s": round(total - database, 3),
                "phases": [{"name": n, "s": round(s, 3), "database": d} for n, s, d in self.phases]}

    def line(self, what: str) -> str:
        r = self.report(what)
        phases = ", ".join(f"{name} {s:.2f} s{' (db)' if database else ''}" for name, s, database in self.phases)
        return (f"start: {what} {r['total_s']:.2f} s after serve began (database {r['database_s']:.2f} s, "
                f"meshfast {r['own_s']:.2f} s): {phases}; json {json.dumps(r)}")
