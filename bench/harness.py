"""The scaffolding every bench script shares: processes, readiness, HTTP, wrk, provenance, results.

A bench script starts its servers as :class:`Server` process groups (``stop()`` ends only what it
started), waits for each with :func:`wait_until`, drives them (:func:`run_wrk`, bench/loadgen.py),
and writes one JSON document that opens with :func:`run_header` (the command, the git sha, the
build profile, the CPU and the versions: :func:`provenance`) and closes with :func:`finish`.
The stacks built from these (hello, meshfast on its embedded database, testserve, nginx) live in
models_bench.py, proxy_bench.py and floor_bench.py, which the other scripts build on.
"""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import json
import os
import platform
import resource
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
WRK_LUA = Path(__file__).resolve().with_name("wrk_report.lua")
STOP_GRACE_S = 15.0
WRK_TIMEOUT = "5s"
WRK_JSON_PREFIX = "WRK_JSON "
BUSY_WARN_PCT = 20.0


class BenchError(RuntimeError):
    """A run that cannot produce a valid number (server did not start, wrong answer, non-2xx)."""


# --------------------------------------------------------------------------------------------- HTTP


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_request(
    method: str,
    url: str,
    headers: dict[str, str] | None = None,
    body: object | None = None,
    timeout_s: float = 5.0,
) -> tuple[int, dict[str, str], bytes]:
    data = None
    hdrs = dict(headers or {})
    if body is not None:
        data = json.dumps(body).encode()
        hdrs["content-type"] = "application/json"
    req = urllib.request.Request(url, data=data, headers=hdrs, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return resp.status, dict(resp.headers.items()), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers.items()), exc.read()


def admin_call(base: str, admin_token: str, method: str, path: str, body: object | None = None, *,
               expect: Iterable[int] = (200, 201, 204), timeout_s: float = 30.0, empty: object = None,
               detail: int = 500) -> Any:
    """One admin API call as the admin token; its decoded JSON (``empty`` for an empty body).
    Any status outside ``expect`` is fatal (the error quotes ``detail`` bytes of the body)."""
    status, _, raw = http_request(method, base + path, {"authorization": f"Bearer {admin_token}"}, body,
                                  timeout_s=timeout_s)
    if status not in expect:
        raise BenchError(f"{method} {path} answered {status}: {raw[:detail]!r}")
    return json.loads(raw) if raw else empty


def admin_create(base: str, admin_token: str, path: str, body: dict) -> dict:
    """POST to the admin API and return the created entity; anything but 201 is fatal."""
    status, _, raw = http_request(
        "POST", base + path, {"authorization": f"Bearer {admin_token}"}, body, timeout_s=30.0
    )
    if status != 201:
        raise BenchError(f"POST {path} answered {status}: {raw[:500]!r}")
    return json.loads(raw)


# ---------------------------------------------------------------------------------------- processes


@dataclass
class Server:
    """A server process group started by this harness; stop() ends only what it started."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    proc: subprocess.Popen | None = None
    _log: object | None = None

    def start(self) -> None:
        self._log = open(self.log_path, "wb")
        # NOTE: a new session so the Granian workers form one process group we can signal by id.
        self.proc = subprocess.Popen(
            self.argv,
            cwd=ROOT,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise BenchError(
                f"{self.name} exited with {self.proc.returncode} before it was ready; log tail:\n"
                + self.log_tail()
            )

    def log_tail(self, max_bytes: int = 4000) -> str:
        try:
            data = self.log_path.read_bytes()
        except OSError:
            return ""
        return data[-max_bytes:].decode(errors="replace")

    def stop(self) -> dict:
        """SIGTERM the main process, SIGKILL the group after STOP_GRACE_S; report what happened."""
        report: dict = {"signal": None, "exit_code": None, "stop_s": None}
        if self.proc is None:
            return report
        t0 = time.monotonic()
        pgid = self.proc.pid  # start_new_session made the leader's pid the group id
        if self.proc.poll() is None:
            report["signal"] = "SIGTERM"
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                report["signal"] = "SIGKILL"
                _killpg(pgid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        # Workers that outlived their parent still belong to the group.
        if _group_alive(pgid):
            deadline = time.monotonic() + 5
            while _group_alive(pgid) and time.monotonic() < deadline:
                time.sleep(0.1)
            if _group_alive(pgid):
                _killpg(pgid, signal.SIGKILL)
                report["group_killed"] = True
        report["exit_code"] = self.proc.returncode
        report["stop_s"] = round(time.monotonic() - t0, 3)
        if self._log is not None:
            self._log.close()
        return report

def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass

def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True

def stop_processes_mentioning(path: str) -> list[int]:
    """End leftovers (e.g. an embedded postmaster) whose command line names our temp data dir."""
    me = os.getpid()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if path in cmdline:
            pids.append(int(entry.name))
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 10
    for pid in pids:
        while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
            time.sleep(0.1)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return pids

def wait_until(predicate, timeout_s: float, server: Server, what: str) -> float:
    """Poll predicate() until true; returns seconds waited. Fails fast if the server died."""
    t0 = time.monotonic()
    last_error = None
    while time.monotonic() - t0 < timeout_s:
        server.check_alive()
        try:
            if predicate():
                return round(time.monotonic() - t0, 3)
        except (OSError, urllib.error.URLError, ValueError) as exc:
            last_error = exc
        time.sleep(0.1)
    raise BenchError(
        f"{server.name}: {what} not reached within {timeout_s} s (last error: {last_error!r}); "
        f"log tail:\n{server.log_tail()}"
    )


def nginx_server(work_dir: Path, conf: Path, env: dict[str, str], name: str = "upstream") -> Server:
    """nginx in the foreground on ``conf``, its prefix, error log and stdout in ``work_dir``."""
    return Server(name, ["nginx", "-p", str(work_dir), "-e", str(work_dir / "nginx-error.log"), "-c", str(conf),
                         "-g", "daemon off;"], env, work_dir / "nginx.log")


def default_meshfast_cmd(fallback: bool = True) -> str:
    """``--meshfast-cmd``'s default: the meshfast script beside this interpreter (with ``fallback``,
    ``meshfast`` on the PATH when there is none)."""
    beside = Path(sys.executable).with_name("meshfast")
    return str(beside) if beside.exists() or not fallback else "meshfast"


def raise_nofile() -> dict:
    """Held-connection runs need ~2 descriptors per connection on each side: raise the soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError):
        pass
    return {"before": soft, "after": resource.getrlimit(resource.RLIMIT_NOFILE)[0], "hard": hard}


def cpu_busy_pct(window_s: float = 1.0) -> float | None:
    """Machine-wide CPU busy share over a window, from /proc/stat: other load on the shared cores."""

    def sample() -> tuple[int, int]:
        fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
        return sum(fields), idle

    try:
        total0, idle0 = sample()
        time.sleep(window_s)
        total1, idle1 = sample()
    except (OSError, ValueError, IndexError):
        return None
    total = total1 - total0
    return round(100.0 * (total - (idle1 - idle0)) / total, 1) if total > 0 else None


# -------------------------------------------------------------------------------------------- wrk


def wrk_argv(args, url: str, headers: dict[str, str], duration_s: int) -> list[str]:
    argv = [
        "wrk",
        "--threads", str(args.threads),
        "--connections", str(args.connections),
        "--duration", f"{duration_s}s",
        "--timeout", WRK_TIMEOUT,
        "--script", str(WRK_LUA),
    ]
    for k, v in headers.items():
        argv += ["--header", f"{k}: {v}"]
    return argv + [url]


def run_wrk(argv: list[str], duration_s: float) -> dict:
    out = subprocess.run(argv, capture_output=True, text=True, timeout=duration_s + 60)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith(WRK_JSON_PREFIX)]
    if out.returncode != 0 or not lines:
        raise BenchError(f"wrk failed (rc {out.returncode}):\n{out.stdout}\n{out.stderr}")
    result = json.loads(lines[-1][len(WRK_JSON_PREFIX):])
    result["stdout"] = out.stdout
    return result


def redact(argv: list[str], secret_values: list[str]) -> list[str]:
    red = []
    for a in argv:
        for s in secret_values:
            a = a.replace(s, "<redacted>")
        red.append(a)
    return red


# ---------------------------------------------------------------------------------- results, provenance


def command_line(argv: list[str] | None) -> str:
    """This script's command line, as run (``argv`` is what main() was given, else sys.argv)."""
    return shlex.join([sys.executable] + (sys.argv if argv is None else [sys.argv[0], *argv]))


def run_header(argv: list[str] | None, started: dt.datetime, provenance: dict) -> dict:
    """What every result document opens with: when, the exact command, where, and the provenance."""
    return {"timestamp": started.isoformat(), "command": command_line(argv), "cwd": os.getcwd(),
            "provenance": provenance}


def finish(doc: dict, failures: list[str], started: dt.datetime, out_path: Path, tag: str,
           print_tables: Callable[[dict], None] | None = None, indent: int = 1) -> int:
    """Records the verdict and the run's duration, writes the JSON, prints the tables, the failures
    and where it all went; returns the exit status (1 when anything failed)."""
    doc["failures"] = failures
    doc["ok"] = not failures
    doc["total_s"] = round((dt.datetime.now(dt.UTC) - started).total_seconds(), 1)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(doc, indent=indent) + "\n")
    if print_tables is not None:
        print_tables(doc)
    if failures:
        print(f"\n[{tag}] failures:\n  " + "\n  ".join(f[:500] for f in failures), file=sys.stderr)
    print(f"\n[{tag}] wrote {out_path} in {doc['total_s']:.0f} s" + ("" if doc["ok"] else " (FAILED run)"))
    return 0 if doc["ok"] else 1


def cmd_output(argv: list[str], cwd: Path | str = ROOT) -> tuple[int, str]:
    try:
        out = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return -1, str(exc)
    return out.returncode, (out.stdout + out.stderr).strip()


def dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def meshfast_probe(meshfast_cmd: str) -> dict:
    """What `meshfast serve` will import: probed from a neutral cwd so the source tree cannot shadow it."""
    code = (
        "import json, importlib.metadata as m\n"
        "import meshfast\n"
        "info = {'version': getattr(meshfast, '__version__', None), 'path': meshfast.__file__}\n"
        "try:\n"
        "    info['dist_version'] = m.version('meshfast')\n"
        "except Exception:\n"
        "    info['dist_version'] = None\n"
        "try:\n"
        "    import meshfast._core as c\n"
        "    info['core_path'] = c.__file__\n"
        "except Exception as e:\n"
        "    info['core_error'] = repr(e)\n"
        "for dist in ('granian', 'msgspec'):\n"
        "    try:\n"
        "        info[dist] = m.version(dist)\n"
        "    except Exception:\n"
        "        info[dist] = None\n"
        "print(json.dumps(info))\n"
    )
    exe = shutil.which(shlex.split(meshfast_cmd)[0])
    exe = os.path.abspath(exe) if exe else None
    python = _script_interpreter(exe) or sys.executable
    rc, out = cmd_output([python, "-c", code], cwd=tempfile.gettempdir())
    if rc != 0:
        return {"importable": False, "error": out[-500:], "executable": exe}
    info = json.loads(out.splitlines()[-1])
    info["importable"] = True
    info["executable"] = exe
    info["python"] = python
    return info


def _script_interpreter(exe: str | None) -> str | None:
    """The Python behind a console script (its shebang), so the probe sees what `serve` runs."""
    if not exe:
        return None
    try:
        with open(exe, "rb") as f:
            first = f.readline(500).decode(errors="replace").strip()
    except OSError:
        return None
    if first.startswith("#!") and "python" in first:
        return first[2:].strip().split()[0]
    return None


def cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def provenance(args, dists: Iterable[str] = ()) -> dict:
    """Where a run ran: git sha and state, build profile, versions (plus those of ``dists``), CPU,
    host. ``args.meshfast_cmd`` is probed for the meshfast it runs unless ``args.only`` is "hello"."""
    rc, sha = cmd_output(["git", "rev-parse", "HEAD"])
    git_sha = sha if rc == 0 else "unknown"
    # Dirty means the sources differ from the commit: what the benches and the paper write
    # (results, figures, the summary and the PDF) does not count.
    rc_status, status = cmd_output(["git", "status", "--porcelain", "--", ".", ":!bench/results", ":!paper/figures",
                                     ":!paper/data", ":!paper/meshfast.pdf"])
    git_dirty = bool(status) if rc_status == 0 else None
    profile = os.environ.get("MESHFAST_BUILD_PROFILE")
    _, wrk_version = cmd_output(["wrk", "-v"])
    mesh = meshfast_probe(args.meshfast_cmd) if args.only != "hello" else None
    prov = {
        "git_sha": git_sha,
        "git_dirty": git_dirty,
        "build_profile": profile or "release",
        "build_profile_source": "env MESHFAST_BUILD_PROFILE" if profile else "default (not measured)",
        "versions": {
            "python": platform.python_version(),
            "python_implementation": platform.python_implementation(),
            "granian": dist_version("granian"),
            "msgspec": dist_version("msgspec"),
            "meshfast": (mesh.get("dist_version") or mesh.get("version"))
            if mesh and mesh.get("importable") else None,
            "wrk": wrk_version.splitlines()[0] if wrk_version else None,
        },
        "meshfast_install": mesh,
        "cpu": {
            "count": os.cpu_count(),
            "affinity_count": len(os.sched_getaffinity(0)),
            "model": cpu_model(),
        },
        "host": {
            "kernel": platform.release(),
            "machine": platform.machine(),
            "loadavg_at_start": list(os.getloadavg()),
        },
    }
    for dist in dists:
        prov["versions"][dist] = dist_version(dist)
    return prov


def format_number(x: float | None, digits: int = 1) -> str:
    """A figure for the tables: thousands separated from 100 up, else ``digits`` decimals; ``-`` for none."""
    return "-" if x is None else f"{x:,.0f}" if abs(x) >= 100 else f"{x:.{digits}f}"
