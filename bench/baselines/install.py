"""Installs the baseline gateways for the paper's comparison, each apart from meshfast's environment.

- LiteLLM proxy, pinned in `litellm/requirements.txt` (its dependencies in `litellm/constraints.txt`,
  a `pip freeze` of a working install), into its own venv `litellm/.venv`;
- Portkey gateway, pinned in `portkey/package.json` (with `@hono/node-server` 1.13.8: later versions
  break its streaming) and `portkey/package-lock.json`, into `portkey/node_modules` (`npm ci`).

Idempotent: a baseline whose pinned version is already installed is left alone.

    python -m bench.baselines.install [litellm] [portkey]
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
LITELLM_DIR = HERE / "litellm"
LITELLM_VENV = LITELLM_DIR / ".venv"
PORTKEY_DIR = HERE / "portkey"
PORTKEY_ENTRY = PORTKEY_DIR / "node_modules" / "@portkey-ai" / "gateway" / "build" / "start-server.js"
INSTALL_TIMEOUT_S = 900

_why: dict[str, str] = {}


def _pinned_litellm() -> str:
    for line in (LITELLM_DIR / "requirements.txt").read_text().splitlines():
        if line.startswith("litellm"):
            return line.split("==", 1)[1].strip()
    raise RuntimeError("litellm/requirements.txt pins no litellm")


def litellm_bin() -> Path | None:
    exe = LITELLM_VENV / "bin" / "litellm"
    if exe.exists() and litellm_version() == _pinned_litellm():
        return exe
    _why.setdefault("litellm", f"not installed in {LITELLM_VENV} (run python -m bench.baselines.install litellm)")
    return None


def litellm_version() -> str | None:
    py = LITELLM_VENV / "bin" / "python"
    if not py.exists():
        return None
    out = subprocess.run([str(py), "-c", "import importlib.metadata as m; print(m.version('litellm'))"],
                         capture_output=True, text=True, timeout=60)
    return out.stdout.strip() or None


def portkey_entry() -> Path | None:
    if PORTKEY_ENTRY.exists():
        return PORTKEY_ENTRY
    _why.setdefault("portkey", f"not installed in {PORTKEY_DIR} (run python -m bench.baselines.install portkey)")
    return None


def portkey_versions() -> dict:
    out = {}
    for name in ("@portkey-ai/gateway", "@hono/node-server"):
        pkg = PORTKEY_DIR / "node_modules" / name / "package.json"
        out[name] = json.loads(pkg.read_text())["version"] if pkg.exists() else None
    node = shutil.which("node")
    out["node"] = subprocess.run([node, "--version"], capture_output=True, text=True).stdout.strip() if node else None
    return out


def why_missing(name: str) -> str:
    return _why.get(name, "unknown")


def install_litellm() -> dict:
    if litellm_bin() is not None:
        return {"litellm": litellm_version(), "installed": "already"}
    _why.pop("litellm", None)
    if not (LITELLM_VENV / "bin" / "python").exists():
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(LITELLM_VENV)], check=True)
    out = subprocess.run([str(LITELLM_VENV / "bin" / "pip"), "install", "-q", "-r",
                          str(LITELLM_DIR / "requirements.txt"), "-c", str(LITELLM_DIR / "constraints.txt")],
                         capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S)
    if out.returncode != 0:
        _why["litellm"] = f"pip install failed: {(out.stdout + out.stderr)[-1500:]}"
        return {"litellm": None, "error": _why["litellm"]}
    return {"litellm": litellm_version(), "installed": "now"}


def install_portkey() -> dict:
    if portkey_entry() is not None and portkey_versions()["@hono/node-server"] == "1.13.8":
        return {**portkey_versions(), "installed": "already"}
    _why.pop("portkey", None)
    npm = shutil.which("npm")
    if npm is None:
        _why["portkey"] = "npm not found"
        return {"error": _why["portkey"]}
    cmd = "ci" if (PORTKEY_DIR / "package-lock.json").exists() else "install"
    out = subprocess.run([npm, cmd, "--no-audit", "--no-fund", "--silent"], cwd=PORTKEY_DIR, capture_output=True,
                         text=True, timeout=INSTALL_TIMEOUT_S)
    if out.returncode != 0:
        _why["portkey"] = f"npm {cmd} failed: {(out.stdout + out.stderr)[-1500:]}"
        return {"error": _why["portkey"]}
    return {**portkey_versions(), "installed": "now"}


def main(argv: list[str]) -> int:
    names = argv or ["litellm", "portkey"]
    report = {}
    if "litellm" in names:
        report["litellm"] = install_litellm()
    if "portkey" in names:
        report["portkey"] = install_portkey()
    print(json.dumps(report, indent=1))
    return 0 if not any("error" in r for r in report.values()) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
