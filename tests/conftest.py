"""Fixtures that run the real thing: `meshfast serve` with Granian workers and an embedded
PostgreSQL in a temporary data dir, reached over real sockets."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest


def tag() -> str:
    """A short random suffix for names that must not clash between tests sharing a gateway."""
    return secrets.token_hex(4)


def until(check: Any, timeout_s: float = 10.0, what: str = "condition") -> Any:
    """Polls ``check`` until it returns something truthy (returned), or fails after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def clear_of_window_edge(period_s: int, needed_s: float) -> int:
    """Returns the current UTC window of ``period_s`` (an hour, a day) once at least ``needed_s``
    remain of it, waiting for the next one to begin when fewer do. Counts compared across a test
    would otherwise straddle a window edge, where caps legitimately start over; the test asserts at
    its end that it is still in the returned window."""
    if period_s - time.time() % period_s < needed_s:
        time.sleep(period_s - time.time() % period_s + 0.05)
    return int(time.time() // period_s)


def in_window(period_s: int) -> int:
    """The current UTC window of ``period_s`` (see :func:`clear_of_window_edge`)."""
    return int(time.time() // period_s)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Gateway:
    """One `meshfast serve --workers N` process tree and helpers to talk to it."""

    def __init__(self, data_dir: Path, workers: int = 2, admin_token: str | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.data_dir = data_dir
        self.workers = workers
        self.admin_token = admin_token or "test-admin-" + secrets.token_urlsafe(16)
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.extra_env = env or {}
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = data_dir.parent / f"serve-{self.port}.log"
        self.client = httpx.Client(base_url=self.base_url, timeout=10)

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
        env.update(
            MESHFAST_DATA_DIR=str(self.data_dir),
            MESHFAST_ADMIN_TOKEN=self.admin_token,
            MESHFAST_LOG_LEVEL="info",
            **self.extra_env,
        )
        return env

    def start(self, timeout_s: float = 90) -> Gateway:
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "meshfast.cli", "serve", "--workers", str(self.workers),
             "--host", "127.0.0.1", "--port", str(self.port)],
            env=self.env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"meshfast serve exited {self.proc.returncode}:\n{self.log()}")
            with contextlib.suppress(httpx.HTTPError):
                if self.client.get("/readyz").status_code == 200 and len(self.worker_pids()) == self.workers:
                    return self
            time.sleep(0.2)
        raise RuntimeError(f"meshfast serve did not become ready:\n{self.log()}")

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.proc = None

    @property
    def database_url(self) -> str:
        return f"postgresql://postgres:@/postgres?host={self.data_dir / 'pg'}"

    def fetch_row(self, request_id: str, timeout_s: float = 5.0) -> dict[str, Any]:
        """The request_logs row of one request, once the telemetry drain has written it."""
        import asyncio

        import asyncpg

        async def query() -> dict[str, Any] | None:
            conn = await asyncpg.connect(self.database_url)
            try:
                row = await conn.fetchrow("SELECT * FROM request_logs WHERE request_id = $1", request_id)
                return None if row is None else dict(row)
            finally:
                await conn.close()

        deadline = time.monotonic() + timeout_s
        while True:
            row = asyncio.run(query())
            if row is not None:
                return row
            if time.monotonic() > deadline:
                raise AssertionError(f"no request_logs row for {request_id}")
            time.sleep(0.1)

    def fetch_rows(self, column: str, values: list[str], at_least: int = 1,
                   timeout_s: float = 5.0) -> list[dict[str, Any]]:
        """The rows whose ``column`` is one of ``values``, oldest first, once at least
        ``at_least`` of them are written."""
        import asyncio

        import asyncpg

        assert column in ("model_name", "requested_model", "request_id", "user_id"), column

        async def query() -> list[dict[str, Any]]:
            conn = await asyncpg.connect(self.database_url)
            try:
                rows = await conn.fetch(
                    f"SELECT * FROM request_logs WHERE {column}::text = ANY($1::text[]) ORDER BY request_id", values)
                return [dict(r) for r in rows]
            finally:
                await conn.close()

        deadline = time.monotonic() + timeout_s
        while True:
            rows = asyncio.run(query())
            if len(rows) >= at_least or time.monotonic() > deadline:
                return rows
            time.sleep(0.1)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-8000:] if self.log_path.exists() else ""

    def worker_pids(self) -> list[int]:
        """PIDs of the Granian worker processes (children of the supervisor)."""
        if self.proc is None:
            return []
        try:
            parent = psutil.Process(self.proc.pid)
            return sorted(p.pid for p in parent.children(recursive=False)
                          if p.status() != psutil.STATUS_ZOMBIE and "postgres" not in p.name())
        except psutil.NoSuchProcess:
            return []

    # --- admin helpers ----------------------------------------------------------------

    def admin(self, method: str, path: str, body: Any = None, token: str | None = None) -> httpx.Response:
        headers = {"authorization": f"Bearer {token or self.admin_token}"}
        return self.client.request(method, path, json=body, headers=headers)

    def create_provider(self, name: str, **extra: Any) -> dict[str, Any]:
        body = {"name": name, "family": "openai", "base_url": "http://127.0.0.1:9/openai",
                "api_key": "sk-test-" + secrets.token_hex(8), "local": True, "verify": False, **extra}
        response = self.admin("POST", "/admin/providers", body)
        assert response.status_code == 201, response.text
        return response.json()

    def create_model(self, provider_id: str, name: str, **extra: Any) -> dict[str, Any]:
        body = {"provider_id": provider_id, "name": name, "resolved_model": "gpt-test", "kind": "chat",
                "input_price_per_1k_tokens": "0.001", "output_price_per_1k_tokens": "0.002",
                "verify": False, **extra}
        response = self.admin("POST", "/admin/models", body)
        assert response.status_code == 201, response.text
        return response.json()

    def create_user(self, email: str | None = None) -> dict[str, Any]:
        email = email or f"user-{secrets.token_hex(4)}@example.com"
        response = self.admin("POST", "/admin/users", {"email": email, "display_name": email.split("@")[0]})
        assert response.status_code == 201, response.text
        return response.json()

    def grant(self, user_id: str, model_id: str) -> None:
        response = self.admin("POST", "/admin/access", {"user_id": user_id, "model_id": model_id})
        assert response.status_code == 200, response.text

    def query(self, statement: str, *args: Any) -> list[dict[str, Any]]:
        """One SQL statement against the gateway's database (as its owner), its rows as dicts."""
        import asyncio

        import asyncpg

        async def run() -> list[dict[str, Any]]:
            conn = await asyncpg.connect(self.database_url)
            try:
                return [dict(r) for r in await conn.fetch(statement, *args)]
            finally:
                await conn.close()

        return asyncio.run(run())


class WorkerConnections:
    """One keep-alive HTTP/1.1 connection pinned to each worker process.

    The listening socket is shared, so which worker accepts a connection is up to the kernel;
    this opens connections until every worker pid has answered one, then reuses them.
    """

    def __init__(self, gateway: Gateway, attempts: int = 400) -> None:
        self.by_pid: dict[int, socket.socket] = {}
        spare: list[socket.socket] = []
        wanted = set(gateway.worker_pids())
        for _ in range(attempts):
            sock = socket.create_connection(("127.0.0.1", gateway.port), timeout=5)
            status, _, body = self._exchange(sock, "GET", "/healthz", {})
            pid = json.loads(body)["pid"]
            if pid in self.by_pid:
                spare.append(sock)
            else:
                self.by_pid[pid] = sock
            if wanted <= set(self.by_pid):
                break
        for sock in spare:
            sock.close()
        if not wanted <= set(self.by_pid):
            raise RuntimeError(f"reached workers {sorted(self.by_pid)}, wanted {sorted(wanted)}")

    @staticmethod
    def _exchange(sock: socket.socket, method: str, path: str, headers: dict[str, str],
                  body: bytes = b"") -> tuple[int, dict[str, str], bytes]:
        lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1"] + [f"{k}: {v}" for k, v in headers.items()]
        if body:
            lines.append(f"Content-Length: {len(body)}")
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
        buf = b""
        while b"\r\n\r\n" not in buf:
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionError("connection closed")
            buf += chunk
        head, rest = buf.split(b"\r\n\r\n", 1)
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        parsed = {k.strip().lower(): v.strip() for k, v in (h.split(":", 1) for h in header_lines)}
        length = int(parsed.get("content-length", "0"))
        while len(rest) < length:
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionError("connection closed")
            rest += chunk
        return int(status_line.split()[1]), parsed, rest[:length]

    def post(self, pid: int, path: str, headers: dict[str, str], body: bytes) -> tuple[int, bytes]:
        status, _, answer = self._exchange(self.by_pid[pid], "POST", path,
                                           {"Content-Type": "application/json", **headers}, body)
        return status, answer

    def get_all(self, path: str, headers: dict[str, str]) -> dict[int, tuple[int, bytes]]:
        return {pid: (lambda r: (r[0], r[2]))(self._exchange(sock, "GET", path, headers))
                for pid, sock in self.by_pid.items()}

    def close(self) -> None:
        for sock in self.by_pid.values():
            sock.close()


# Short timeouts so the hang and retry scenarios finish in seconds.
SESSION_ENV = {
    "MESHFAST_STREAM_IDLE_TIMEOUT_S": "1.5",
    "MESHFAST_UPSTREAM_CONNECT_TIMEOUT_S": "2",
    "MESHFAST_UPSTREAM_DEADLINE_S": "20",
}


class EmulatedProviders:
    """The emulated providers in their own Granian process."""

    def __init__(self, root: Path) -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log_path = root / "testserve.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.client = httpx.Client(base_url=self.base_url, timeout=10)

    def start(self) -> EmulatedProviders:
        env = dict(os.environ, TESTSERVE_SLOW_DELAY_MS="1000", TESTSERVE_HANG_SECONDS="30",
                   TESTSERVE_VIDEO_JOB_S="0.5")
        self.proc = subprocess.Popen([sys.executable, "-m", "testserve", "--port", str(self.port)],
                                     env=env, stdout=open(self.log_path, "ab"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if self.client.get("/healthz").status_code == 200:
                    return self
            time.sleep(0.1)
        raise RuntimeError("testserve did not start")

    def requests(self, **params: Any) -> list[dict[str, Any]]:
        return self.client.get("/_debug/requests", params={"limit": 500, **params}).json()["entries"]

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)


@pytest.fixture(scope="session")
def testserve() -> Iterator[EmulatedProviders]:
    root = Path(tempfile.mkdtemp(prefix="ts-"))
    server = EmulatedProviders(root).start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def running_gateway(workers: int, env: dict[str, str] | None = None) -> Iterator[Gateway]:
    """A gateway in a temporary data dir with the short test timeouts (or ``env``, which should
    include them), stopped and removed after."""
    root = Path(tempfile.mkdtemp(prefix="mf-"))
    gw = Gateway(root / "data", workers=workers, env=SESSION_ENV if env is None else env).start()
    try:
        yield gw
    finally:
        gw.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def gateway() -> Iterator[Gateway]:
    """A shared two-worker gateway for tests that do not restart or kill it."""
    with running_gateway(2) as gw:
        yield gw


@pytest.fixture
def fresh_dir() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="mf-"))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: kills processes or restarts the database (runs in CI, takes tens of seconds)")


class ClusterInstance(Gateway):
    """One `meshfast serve` of a :class:`Cluster`: its own data dir and port, the cluster's database."""

    def __init__(self, data_dir: Path, database_url: str, workers: int, admin_token: str,
                 env: dict[str, str]) -> None:
        data_dir.parent.mkdir(parents=True, exist_ok=True)
        super().__init__(data_dir, workers=workers, admin_token=admin_token, env={**env, "DATABASE_URL": database_url})
        self._database_url = database_url

    @property
    def database_url(self) -> str:
        return self._database_url

    def kill(self) -> None:
        """SIGKILL to the whole instance at once: supervisor and workers (its process group)."""
        if self.proc is None:
            return
        tree = [self.proc.pid, *self.worker_pids()]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        for pid in tree:  # a child that left the group goes too
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.proc.wait(30)
        until(lambda: not [p for p in tree if psutil.pid_exists(p)
                           and psutil.Process(p).status() != psutil.STATUS_ZOMBIE], 10, "the killed tree to go")
        self.proc = None


class Cluster:
    """Several `meshfast serve` instances sharing one embedded PostgreSQL (started here, passed to
    each as DATABASE_URL) and one secrets file (created by the first, copied to the others)."""

    def __init__(self, root: Path, size: int = 3, workers: int = 2, env: dict[str, str] | None = None) -> None:
        self.root = root
        self.size = size
        self.workers = workers
        self.env = SESSION_ENV if env is None else env
        self.pgdata = root / "pg"
        self.admin_token = "test-admin-" + secrets.token_urlsafe(16)
        self.database_url = ""
        self.instances: list[ClusterInstance] = []
        self._pg: Any = None

    def start(self) -> Cluster:
        from concurrent.futures import ThreadPoolExecutor

        from meshfast.store.database import EmbeddedPostgres

        self._pg = EmbeddedPostgres(self.pgdata)
        self.database_url = self._pg.start()
        self.instances = [ClusterInstance(self.root / f"i{n}" / "data", self.database_url, self.workers,
                                          self.admin_token, self.env) for n in range(self.size)]
        first, rest = self.instances[0], self.instances[1:]
        first.start()
        for instance in rest:
            instance.data_dir.mkdir(mode=0o700, parents=True)
            shutil.copy2(first.data_dir / "secrets.json", instance.data_dir / "secrets.json")
        with ThreadPoolExecutor(len(rest) or 1) as pool:
            list(pool.map(lambda instance: instance.start(), rest))
        return self

    def stop(self) -> None:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(len(self.instances) or 1) as pool:
            list(pool.map(lambda instance: instance.stop(), self.instances))
        if self._pg is not None:
            # NOTE: pgserver stops only the postmaster it started; one restarted by start_database
            # would outlive the test session.
            with contextlib.suppress(Exception):
                if (self.pgdata / "postmaster.pid").exists():
                    self.stop_database()
            self._pg.stop()
            self._pg = None

    def query(self, sql: str, *args: Any) -> list[dict[str, Any]]:
        import asyncio

        import asyncpg

        async def run() -> list[dict[str, Any]]:
            conn = await asyncpg.connect(self.database_url)
            try:
                return [dict(r) for r in await conn.fetch(sql, *args)]
            finally:
                await conn.close()

        return asyncio.run(run())

    # --- the shared PostgreSQL, stopped and started behind the instances' backs ------------

    def _pg_ctl(self, args: list[str]) -> None:
        from pgserver._commands import pg_ctl

        # NOTE: pgserver runs PostgreSQL as its own OS user when started by root.
        user = "pgserver" if os.geteuid() == 0 else None
        pg_ctl(args, pgdata=self.pgdata, user=user, timeout=60)

    def stop_database(self) -> None:
        self._pg_ctl(["-w", "-m", "fast", "stop"])

    def start_database(self) -> None:
        # The options pgserver starts it with: no TCP, the socket in the data dir.
        self._pg_ctl(["-w", "-o", '-h ""', "-o", f"-k {self.pgdata}", "-l", str(self.pgdata / "log"), "start"])


@contextlib.contextmanager
def running_cluster(size: int = 3, workers: int = 2, env: dict[str, str] | None = None) -> Iterator[Cluster]:
    """A :class:`Cluster` in a temporary directory, stopped and removed after."""
    root = Path(tempfile.mkdtemp(prefix="mfc-"))
    cluster = Cluster(root, size=size, workers=workers, env=env)
    try:
        yield cluster.start()
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
