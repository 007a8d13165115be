"""The release wheel in a clean virtualenv outside the repository: install it, serve the demo,
make one call through it, stop. `make wheel-smoke` (CI) runs it on the x86_64 wheel in dist/.

    python server/wheel_smoke.py dist/meshfast-*-manylinux_2_28_x86_64.whl
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main(wheel: str) -> int:
    wheel_path = Path(wheel).resolve()
    with tempfile.TemporaryDirectory(prefix="meshfast-wheel-") as tmp:
        work = Path(tmp)
        venv = work / "venv"
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
        # Dependencies at the versions the project tests (constraints only: nothing else is installed).
        subprocess.run([*pip, "-c", str(ROOT / "requirements-lock.txt"), str(wheel_path)], check=True, cwd=work)
        port, demo_port = free_port(), free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("MESHFAST_", "DATABASE_URL", "PYTHON"))}
        env.update(MESHFAST_DATA_DIR=str(work / "data"), MESHFAST_ADMIN_TOKEN="wheel-smoke-admin")
        log = open(work / "serve.log", "w+b")
        proc = subprocess.Popen([str(venv / "bin" / "meshfast"), "serve", "--demo", "--demo-port", str(demo_port),
                                 "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                                cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            base = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 120
            key = None
            while time.monotonic() < deadline:
                if proc.poll() is not None:
                    raise SystemExit(f"meshfast serve exited {proc.returncode}:\n{(work / 'serve.log').read_text()}")
                found = re.search(r"demo key: (mesh_live_[A-Za-z0-9_-]{43})", (work / "serve.log").read_text())
                try:
                    ready = urllib.request.urlopen(f"{base}/readyz", timeout=2).status == 200
                except OSError:
                    ready = False
                if found and ready:
                    key = found.group(1)
                    break
                time.sleep(0.5)
            if key is None:
                raise SystemExit(f"the demo did not come up:\n{(work / 'serve.log').read_text()}")
            request = urllib.request.Request(f"{base}/v1/proxy?model=ts-anthropic", data=b'{"query":"hello"}',
                                             headers={"authorization": f"Bearer {key}"}, method="POST")
            lines = [json.loads(line) for line in urllib.request.urlopen(request, timeout=30).read().splitlines()]
            if not lines or not lines[-1].get("done") or not lines[-1]["usage"]["output_tokens"]:
                raise SystemExit(f"the demo call did not finish: {lines}")
            installed = subprocess.run([str(venv / "bin" / "python"), "-c",
                                        "import meshfast._core as c, meshfast; print(c.__file__)"],
                                       capture_output=True, text=True, check=True, cwd=work).stdout.strip()
            if not installed.startswith(str(venv)):
                raise SystemExit(f"meshfast._core came from {installed}, not the wheel's virtualenv")
            print(f"wheel smoke: {wheel_path.name} installed in a clean virtualenv, served the demo, "
                  f"{len(lines) - 1} delta(s) and a done line ({installed})")
            return 0
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    sys.exit(main(sys.argv[1]))
