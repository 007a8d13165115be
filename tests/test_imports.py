"""Every module of the package imports on its own, first, in a fresh interpreter: an import cycle
that one entry point's order hides (the server imports the scope before the rules; the CLI the
other way round) fails here rather than in a user's `meshfast apply`."""

from __future__ import annotations

import pkgutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import meshfast


def _modules() -> list[str]:
    names = [info.name for info in pkgutil.walk_packages(meshfast.__path__, "meshfast.")]
    return sorted(n for n in names if not n.endswith("__main__"))


def test_every_module_imports_first_in_a_fresh_interpreter() -> None:
    modules = _modules()
    assert "meshfast.admin.scope" in modules and "meshfast.cli" in modules

    def load(name: str) -> tuple[str, int, str]:
        done = subprocess.run([sys.executable, "-c", f"import {name}"], capture_output=True, text=True, timeout=120)
        return name, done.returncode, done.stderr[-600:]

    with ThreadPoolExecutor(max_workers=4) as pool:
        failed = [(n, err) for n, rc, err in pool.map(load, modules) if rc != 0]
    assert not failed, failed
