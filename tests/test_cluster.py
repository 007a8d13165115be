"""Many hosts, one PostgreSQL (issue 15): three `meshfast serve` instances of two workers each share
one embedded PostgreSQL (DATABASE_URL) and one secrets file. Budgets, provider limits, revocation and
the kill switch hold across them; an instance's kill -9 and a database restart lose no row; an
instance with other secrets or a database newer than it knows is refused at start."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from conftest import (
    SESSION_ENV,
    Cluster,
    ClusterInstance,
    EmulatedProviders,
    clear_of_window_edge,
    free_port,
    in_window,
    running_cluster,
    tag,
    until,
)

from meshfast.store import database

Json = dict[str, Any]

# Input is free and output costs $1 per 1k tokens: a call answering MAX_TOKENS tokens costs
# exactly CALL_USD, which is also the worst case the gateway reserves for it.
CALL_USD = Decimal("0.003")
MAX_TOKENS = 3
PROMPT = "hello"
INSTANCE_FIELDS = {"id", "host", "port", "started_at", "last_seen", "workers", "alive", "mode"}


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with running_cluster(size=3, workers=2) as shared:
        yield shared


# --- callers, calls and rows -------------------------------------------------------------------


def _bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def _policy(cap_usd: Decimal) -> Json:
    return {"daily_cap_usd": str(cap_usd), "max_calls_per_hour": None, "allowed_from": None, "allowed_to": None,
            "timezone": "UTC", "active_days": [0, 1, 2, 3, 4, 5, 6], "always_open": True}


def _serves(instance: ClusterInstance, caller: Json) -> bool:
    """Whether the instance knows the caller, its model and its cap (fresh connections, so the
    kernel spreads them over the workers)."""
    for _ in range(4):
        response = httpx.get(f"{instance.base_url}/v1/usage", headers=_bearer(caller["key"]), timeout=10)
        if response.status_code != 200:
            return False
        entry = next((u for u in response.json()["usage"] if u["model"] == caller["name"]), None)
        if entry is None:
            return False
        if caller["cap"] is not None and Decimal(str(entry["daily_cap_usd"])) != caller["cap"]:
            return False
    return True


def _caller(cluster: Cluster, testserve: EmulatedProviders, resolved: str = "dummy-chat",
            cap_calls: int | None = None, output_price: str = "1", **provider: Any) -> Json:
    """A fresh user granted a fresh testserve model, made through instance 0; with ``cap_calls``, a
    daily cap that fits exactly that many calls. Returns once every instance serves it."""
    admin = cluster.instances[0]
    name = f"cl-{tag()}"
    created = admin.create_provider(name, base_url=f"{testserve.base_url}/openai", api_key="testserve-key",
                                    **provider)
    model = admin.create_model(created["id"], name, resolved_model=resolved,
                               input_price_per_1k_tokens="0", output_price_per_1k_tokens=output_price)
    user = admin.create_user()
    admin.grant(user["id"], model["id"])
    cap = None
    if cap_calls is not None:
        cap = cap_calls * CALL_USD
        response = admin.admin("PUT", f"/admin/users/{user['id']}/policies/{model['id']}", _policy(cap))
        assert response.status_code == 200, response.text
    caller = {"user": user, "model": model, "key": user["key"], "name": name, "resolved": resolved, "cap": cap}
    until(lambda: all(_serves(instance, caller) for instance in cluster.instances), 5, "the caller on every instance")
    return caller


def _body() -> Json:
    return {"query": PROMPT, "max_tokens": MAX_TOKENS}


def _proxy(instance: ClusterInstance, caller: Json) -> httpx.Response:
    return httpx.post(f"{instance.base_url}/v1/proxy", params={"model": caller["name"]}, json=_body(),
                      headers=_bearer(caller["key"]), timeout=30)


def _burst(calls: list[tuple[ClusterInstance, Json]]) -> list[httpx.Response]:
    """All ``calls`` at once, each through its instance."""

    async def run() -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=len(calls), max_keepalive_connections=len(calls))
        async with httpx.AsyncClient(timeout=30, limits=limits) as client:
            return await asyncio.gather(*(
                client.post(f"{instance.base_url}/v1/proxy", params={"model": caller["name"]}, json=_body(),
                            headers=_bearer(caller["key"]))
                for instance, caller in calls))

    return asyncio.run(run())


def _cost(row: Json) -> Decimal:
    return Decimal(row["input_cost"]) + Decimal(row["output_cost"])


def _rows_of(cluster: Cluster, caller: Json, calls: int, timeout_s: float = 15) -> list[Json]:
    """The caller's rows once they account for ``calls`` requests (merged denials count `count`)."""
    def rows() -> list[Json]:
        return cluster.query("SELECT * FROM request_logs WHERE user_id::text = $1", caller["user"]["id"])

    found = until(lambda: (lambda r: r if sum(x["count"] for x in r) >= calls else None)(rows()), timeout_s,
                  f"rows of {calls} calls")
    assert sum(r["count"] for r in found) == calls, "more rows than calls"
    return found


def _stored_once(cluster: Cluster, request_ids: list[str], timeout_s: float, about: Any = None) -> None:
    """Every request id has its row, exactly one, within ``timeout_s``; ``about`` describes a missing one."""
    def counts() -> dict[str, int]:
        rows = cluster.query("SELECT request_id, count(*) AS n FROM request_logs WHERE request_id = ANY($1::text[]) "
                             "GROUP BY request_id", request_ids)
        return {r["request_id"]: r["n"] for r in rows}

    deadline = time.monotonic() + timeout_s
    while len(found := counts()) < len(set(request_ids)) and time.monotonic() < deadline:
        time.sleep(0.5)
    missing = set(request_ids) - set(found)
    assert not missing, (f"{len(missing)} of {len(set(request_ids))} answered requests have no row: "
                         f"{[about(rid) if about else rid for rid in sorted(missing)[:5]]}")
    assert found == {rid: 1 for rid in request_ids}, "a request id was written twice"


# --- status ------------------------------------------------------------------------------------


def _instant(value: Any) -> dt.datetime:
    """A timestamp of /admin/status: RFC 3339, or epoch seconds or milliseconds."""
    if isinstance(value, str):
        return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    seconds = value / 1000 if value > 100_000_000_000 else value
    return dt.datetime.fromtimestamp(seconds, dt.UTC)


def _instances(instance: ClusterInstance) -> list[Json]:
    response = instance.admin("GET", "/admin/status")
    assert response.status_code == 200, response.text
    return response.json()["instances"]


def _entry(listed: list[Json], port: int) -> Json | None:
    """The live registration of the instance on ``port`` (a restarted one may also be listed dead)."""
    entries = sorted((e for e in listed if e["port"] == port), key=lambda e: (e["alive"], _instant(e["started_at"])))
    return entries[-1] if entries else None


# --- one keep-alive connection per worker --------------------------------------------------------


class PinnedWorkers:
    """A keep-alive connection to each worker of one instance. The kernel picks the worker of a new
    connection, so this opens connections until every worker has answered one; http.client reads
    the streamed (chunked) answers of successful calls as well as the denials."""

    def __init__(self, instance: ClusterInstance, attempts: int = 400) -> None:
        self.by_pid: dict[int, http.client.HTTPConnection] = {}
        spare: list[http.client.HTTPConnection] = []
        wanted = set(instance.worker_pids())
        for _ in range(attempts):
            conn = http.client.HTTPConnection("127.0.0.1", instance.port, timeout=10)
            conn.request("GET", "/healthz")
            pid = json.loads(conn.getresponse().read())["pid"]
            if pid in self.by_pid:
                spare.append(conn)
            else:
                self.by_pid[pid] = conn
            if wanted <= set(self.by_pid):
                break
        for conn in spare:
            conn.close()
        if not wanted <= set(self.by_pid):
            raise RuntimeError(f"reached workers {sorted(self.by_pid)}, wanted {sorted(wanted)}")

    def proxy_all(self, caller: Json) -> list[tuple[int, bytes]]:
        answers = []
        for conn in self.by_pid.values():
            conn.request("POST", f"/v1/proxy?model={caller['name']}", body=json.dumps(_body()),
                         headers={"content-type": "application/json", **_bearer(caller["key"])})
            response = conn.getresponse()
            answers.append((response.status, response.read()))
        return answers

    def close(self) -> None:
        for conn in self.by_pid.values():
            conn.close()


def _on_all_within(pinned: list[PinnedWorkers], caller: Json, status: int, error: str, since: float,
                   within_s: float) -> None:
    """Every worker of the pinned instances answers ``status`` ``error`` within ``within_s`` of ``since``."""
    while True:
        answers = [answer for workers in pinned for answer in workers.proxy_all(caller)]
        if all(code == status for code, _ in answers):
            break
        assert time.monotonic() - since < within_s, [code for code, _ in answers]
        time.sleep(0.02)
    for _, body in answers:
        assert json.loads(body)["error"] == error, body


# --- traffic through every instance, answers recorded ------------------------------------------


@dataclass(frozen=True, slots=True)
class Answer:
    instance: int
    finished: float
    status: int | None  # None: no answer (connection refused or cut)
    request_id: str | None
    retry_after: str | None
    error: str


class Traffic:
    """One thread per instance calling it back to back; every answer (or its absence) is kept."""

    def __init__(self, cluster: Cluster, caller: Json, pause_s: float = 0.03) -> None:
        self.cluster = cluster
        self.caller = caller
        self.pause_s = pause_s
        self.answers: list[Answer] = []
        self.halted: set[int] = set()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, args=(n,), daemon=True)
                         for n in range(len(cluster.instances))]

    def __enter__(self) -> Traffic:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)

    def _run(self, n: int) -> None:
        instance = self.cluster.instances[n]
        with httpx.Client(base_url=instance.base_url, timeout=30) as client:
            while not self._stop.is_set() and n not in self.halted:
                try:
                    response = client.post("/v1/proxy", params={"model": self.caller["name"]}, json=_body(),
                                           headers=_bearer(self.caller["key"]))
                    answer = Answer(n, time.monotonic(), response.status_code, response.headers.get("x-request-id"),
                                    response.headers.get("retry-after"),
                                    "" if response.status_code == 200 else response.text[:200])
                except httpx.HTTPError as exc:
                    answer = Answer(n, time.monotonic(), None, None, None, repr(exc))
                with self._lock:
                    self.answers.append(answer)
                time.sleep(self.pause_s)


# --- a `meshfast serve` expected to refuse -------------------------------------------------------


def _serve_once(data_dir: Path, database_url: str, args: list[str], timeout_s: float = 20) -> tuple[int | None, str]:
    """Runs `meshfast serve ARGS` against ``database_url``; its exit code (None: still running after
    ``timeout_s``, then killed) and its output. No admin token: a wrongly started instance must not
    replace the cluster's bootstrap token."""
    data_dir.mkdir(parents=True, exist_ok=True)
    shm_dir = data_dir.parent / f"shm-{data_dir.name}"
    shm_dir.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "MESHFAST_ADMIN_TOKEN")}
    env.update(SESSION_ENV, MESHFAST_DATA_DIR=str(data_dir), DATABASE_URL=database_url,
               MESHFAST_SHM_DIR=str(shm_dir), MESHFAST_LOG_LEVEL="info")
    log_path = data_dir.parent / f"serve-{data_dir.name}-{tag()}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "meshfast.cli", "serve", *args, "--workers", "1",
                                 "--host", "127.0.0.1", "--port", str(free_port())],
                                env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code: int | None = proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            code = None
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
    return code, log_path.read_text(errors="replace")


# --- the tests -----------------------------------------------------------------------------------


def _whole_cluster(cluster: Cluster, instance: ClusterInstance) -> list[Json] | None:
    """The registrations of the cluster's instances as ``instance`` lists them, once all are alive in cluster mode."""
    listed = _instances(instance)
    entries = [_entry(listed, other.port) for other in cluster.instances]
    if any(e is None or e["alive"] is not True or e["mode"] != "cluster" for e in entries):
        return None
    return entries  # type: ignore[return-value]


def test_every_instance_lists_the_whole_cluster_in_its_status(cluster: Cluster) -> None:
    """GET /admin/status on each instance lists all three instances: alive, in cluster mode (once the
    last one registered, within a few heartbeats), with their ports and workers."""
    seen_ids: list[set[str]] = []
    for instance in cluster.instances:
        entries = until(lambda i=instance: _whole_cluster(cluster, i), 5, f"all three in cluster mode on :{instance.port}")
        now = dt.datetime.now(dt.UTC)
        for entry, listed in zip(entries, cluster.instances, strict=True):
            assert INSTANCE_FIELDS <= set(entry), entry
            assert entry["port"] == listed.port and entry["workers"] == 2, entry
            assert isinstance(entry["host"], str) and entry["host"], entry
            started, last_seen = _instant(entry["started_at"]), _instant(entry["last_seen"])
            assert started <= last_seen and abs((now - last_seen).total_seconds()) < 10, entry
        ids = {str(entry["id"]) for entry in entries}
        assert len(ids) == len(cluster.instances), entries
        seen_ids.append(ids)
    assert all(ids == seen_ids[0] for ids in seen_ids), "the instances disagree on who is in the cluster"


def test_a_key_revoked_through_one_instance_is_refused_by_every_other_within_1s(
        cluster: Cluster, testserve: EmulatedProviders) -> None:
    """Revoking a user's key through instance A: every worker of B and C answers 401 within 1 s."""
    caller = _caller(cluster, testserve)
    pinned = [PinnedWorkers(instance) for instance in cluster.instances[1:]]
    try:
        until(lambda: all(code == 200 for workers in pinned for code, _ in workers.proxy_all(caller)), 5,
              "the key working on every worker of B and C")
        response = cluster.instances[0].admin("POST", f"/admin/users/{caller['user']['id']}/revoke")
        assert response.status_code == 200, response.text
        _on_all_within(pinned, caller, 401, "invalid_or_revoked_key", time.monotonic(), 1.0)
    finally:
        for workers in pinned:
            workers.close()


def test_the_kill_switch_tripped_through_one_instance_pauses_every_other_within_1s(
        cluster: Cluster, testserve: EmulatedProviders) -> None:
    """Kill switch tripped through A: B and C answer 503 paused_by_admin within 1 s; untripped, they serve again."""
    caller = _caller(cluster, testserve)
    admin = cluster.instances[0]
    pinned = [PinnedWorkers(instance) for instance in cluster.instances[1:]]
    try:
        until(lambda: all(code == 200 for workers in pinned for code, _ in workers.proxy_all(caller)), 5,
              "the caller served by every worker of B and C")
        try:
            assert admin.admin("POST", "/admin/kill-switch", {"tripped": True}).json() == {"kill_switch": True}
            _on_all_within(pinned, caller, 503, "paused_by_admin", time.monotonic(), 1.0)
        finally:
            untripped = admin.admin("POST", "/admin/kill-switch", {"tripped": False})
        assert untripped.json() == {"kill_switch": False}
        since = time.monotonic()
        while not all(code == 200 for workers in pinned for code, _ in workers.proxy_all(caller)):
            assert time.monotonic() - since < 1.0, "B and C still paused 1 s after the untrip"
            time.sleep(0.02)
    finally:
        for workers in pinned:
            workers.close()


def test_a_daily_cap_holds_across_instances_and_its_unused_leases_return(
        cluster: Cluster, testserve: EmulatedProviders) -> None:
    """40 concurrent calls, 4x what a daily cap fits, round-robin over three instances: recorded spend
    stays within the cap and the refusals are 429 budget_exceeded. After 12 s idle the leases are back:
    calls through one instance alone fill the cap to within one call."""
    fits = 10
    caller = _caller(cluster, testserve, cap_calls=fits)
    cap = caller["cap"]
    day = clear_of_window_edge(86400, 60)
    # Each answer streams for ~60 ms, so the admitted calls overlap and hold their reservations together.
    testserve.client.post("/_debug/config", json={"delta_delay_ms": 20}).raise_for_status()
    try:
        responses = _burst([(cluster.instances[n % 3], caller) for n in range(4 * fits)])
    finally:
        testserve.client.post("/_debug/config", json={"delta_delay_ms": 0}).raise_for_status()
    idle_since = time.monotonic()
    ok = [r for r in responses if r.status_code == 200]
    refused = [r for r in responses if r.status_code != 200]
    assert 1 <= len(ok) <= fits, [r.status_code for r in responses]
    for response in refused:
        assert (response.status_code, response.json()["error"]) == (429, "budget_exceeded"), response.text
    rows = _rows_of(cluster, caller, 4 * fits)
    assert sum(_cost(r) for r in rows) <= cap

    time.sleep(max(0.0, idle_since + 12.0 - time.monotonic()))
    one = cluster.instances[0]
    topped_up = 0
    while (response := _proxy(one, caller)).status_code == 200:
        topped_up += 1
        assert topped_up <= fits, "the cap admitted more calls than it fits"
    assert (response.status_code, response.json()["error"]) == (429, "budget_exceeded"), response.text
    assert in_window(86400) == day, "the test ran past its day"
    rows = _rows_of(cluster, caller, 4 * fits + topped_up + 1)
    spent = sum((_cost(r) for r in rows), Decimal(0))
    assert cap - CALL_USD < spent <= cap, (spent, len(ok), topped_up)


def test_a_providers_concurrency_limit_holds_across_instances(cluster: Cluster, testserve: EmulatedProviders) -> None:
    """max_concurrent_upstream 2 and 12 concurrent one-second calls over three instances: testserve
    never has more than 2 in flight; each call succeeds or is 503 provider_busy."""
    caller = _caller(cluster, testserve, resolved=f"dummy-{tag()}-slow", max_concurrent_upstream=2)
    testserve.client.delete("/_debug/requests").raise_for_status()
    responses = _burst([(cluster.instances[n % 3], caller) for n in range(12)])
    peak = testserve.client.get("/_debug/stats").json()["peak_in_flight"]
    assert 1 <= peak <= 2, peak
    ok = [r for r in responses if r.status_code == 200]
    busy = [r for r in responses if r.status_code != 200]
    assert len(ok) >= 2, [r.status_code for r in responses]
    for response in busy:
        assert (response.status_code, response.json()["error"]) == (503, "provider_busy"), response.text
        assert int(response.headers["retry-after"]) >= 1


def test_a_providers_outbound_rate_holds_across_instances(cluster: Cluster, testserve: EmulatedProviders) -> None:
    """max_outbound_rps 10, driven from all three instances for ~11 s: after the first second,
    testserve sees at most 10 x 10 x 1.05 + 10 calls in 10 s; each call succeeds or is 503 provider_busy."""
    rps, duration_s = 10, 10.0
    resolved = f"dummy-rate-{tag()}"
    caller = _caller(cluster, testserve, resolved=resolved, max_outbound_rps=rps)
    testserve.client.delete("/_debug/requests").raise_for_status()

    async def closed_loop() -> list[httpx.Response]:
        answers: list[httpx.Response] = []
        stop = time.monotonic() + duration_s + 1.5
        async with httpx.AsyncClient(timeout=30) as client:

            async def user(instance: ClusterInstance) -> None:
                while time.monotonic() < stop:
                    answers.append(await client.post(
                        f"{instance.base_url}/v1/proxy", params={"model": caller["name"]}, json=_body(),
                        headers=_bearer(caller["key"])))

            await asyncio.gather(*(user(instance) for instance in cluster.instances for _ in range(3)))
        return answers

    answers = asyncio.run(closed_loop())
    for response in answers:
        if response.status_code != 200:
            assert (response.status_code, response.json()["error"]) == (503, "provider_busy"), response.text
    stamps = sorted(e["ts"] for e in testserve.requests(model=resolved, limit=5000))
    assert stamps, "no call reached testserve"
    start = stamps[0] + 1.0
    window = [t for t in stamps if start <= t < start + duration_s]
    assert len(window) <= rps * duration_s * 1.05 + rps, len(window)
    assert len(window) >= rps * duration_s / 2, f"only {len(window)} calls in 10 s: the load did not reach the limit"


def test_a_database_newer_than_this_meshfast_is_refused_at_start(fresh_dir: Path) -> None:
    """A schema version this build does not know: `serve --join` and plain `serve` exit non-zero naming it."""
    pg = database.EmbeddedPostgres(fresh_dir / "pg")
    url = pg.start()
    try:
        asyncio.run(database.migrate(url))
        future = max(m.version for m in database.shipped_migrations()) + 1

        async def from_the_future() -> None:
            conn = await asyncpg.connect(url)
            try:
                await conn.execute("INSERT INTO meshfast_migrations (version, name) VALUES ($1, $2)",
                                   future, "from_a_newer_meshfast")
            finally:
                await conn.close()

        asyncio.run(from_the_future())
        for args in (["--join"], []):
            code, output = _serve_once(fresh_dir / "data", url, args)
            assert code is not None, f"serve {args} started against schema version {future}:\n{output[-3000:]}"
            assert code != 0, output[-3000:]
            assert "schema" in output.lower() and str(future) in output, output[-3000:]
    finally:
        pg.stop()


def test_an_instance_with_other_secrets_refuses_to_join(cluster: Cluster, fresh_dir: Path) -> None:
    """A fourth instance whose secrets.json is not the cluster's exits non-zero within seconds, naming the file."""
    started = time.monotonic()
    code, output = _serve_once(fresh_dir / "data", cluster.database_url, [], timeout_s=15)
    assert code is not None, f"an instance with its own secrets joined the cluster:\n{output[-3000:]}"
    assert code != 0 and "secrets.json" in output, output[-3000:]
    assert time.monotonic() - started < 15
    # The cluster itself is untouched.
    for instance in cluster.instances:
        assert instance.client.get("/readyz").status_code == 200


@pytest.mark.slow
def test_a_killed_instance_loses_no_row_and_its_budget_leases_come_back(
        cluster: Cluster, testserve: EmulatedProviders) -> None:
    """kill -9 of instance C (supervisor and workers) mid-traffic: A and B answer every call; C shows
    dead within 10 s and leaves the list once reclaimed; a cap C held a lease on is whole again within
    30 s; restarted on its data dir, C writes what its ring kept, so every answered call has its row."""
    a, b, c = cluster.instances
    fits = 5
    budget = _caller(cluster, testserve, cap_calls=fits)
    busy = _caller(cluster, testserve, output_price="0.002")
    c_entry = _entry(_instances(a), c.port)
    assert c_entry is not None and c_entry["alive"] is True

    def c_state() -> Json | None:
        return next((e for e in _instances(a) if e["id"] == c_entry["id"]), None)

    with Traffic(cluster, busy) as traffic:
        time.sleep(1.0)
        # One call through C: C now holds a lease on the cap, which it would give back only after
        # seconds of idleness. It dies holding it.
        held = _proxy(c, budget)
        assert held.status_code == 200, held.text
        killed_at = time.monotonic()
        c.kill()
        traffic.halted.add(2)

        until(lambda: (lambda e: e is None or e["alive"] is False)(c_state()), 10, "C shown dead")
        assert time.monotonic() - killed_at <= 10.5

        # The rest of the cap usable through the survivors within 30 s of the kill.
        admitted, survivors, budget_calls = 0, [], 2  # the held call and the refused one after
        while True:
            responses = _burst([((a, b)[n % 2], budget) for n in range(fits - 1 - admitted)])
            budget_calls += len(responses)
            for response in responses:
                if response.status_code == 200:
                    admitted += 1
                    survivors.append(response.headers["x-request-id"])
                else:
                    assert (response.status_code, response.json()["error"]) == (429, "budget_exceeded"), \
                        response.text
            if admitted == fits - 1:
                break
            assert time.monotonic() - killed_at < 30, \
                f"{1 + admitted} of {fits} calls admitted 30 s after the kill"
            time.sleep(0.5)
        over = _proxy(a, budget)
        assert (over.status_code, over.json()["error"]) == (429, "budget_exceeded"), over.text

        until(lambda: c_state() is None, max(1.0, killed_at + 35 - time.monotonic()), "C gone from the list")

    by_instance = {n: [x for x in traffic.answers if x.instance == n] for n in range(3)}
    for n in (0, 1):
        failed = [x for x in by_instance[n] if x.status != 200]
        assert not failed and by_instance[n], failed[:5]
    before = [x for x in by_instance[2] if x.finished < killed_at]
    assert before and all(x.status == 200 for x in before), [x for x in before if x.status != 200][:5]
    assert all(x.status in (200, None) for x in by_instance[2]), by_instance[2][-5:]

    c.start()
    until(lambda: (lambda e: e is not None and e["alive"])(_entry(_instances(a), c.port)), 10, "C back in the list")
    answered = [x.request_id for x in traffic.answers if x.status == 200 and x.request_id]
    answered += [held.headers["x-request-id"], *survivors]
    by_id: dict[str, Any] = {x.request_id: x for x in traffic.answers if x.request_id}
    _stored_once(cluster, answered, 30, lambda rid: (rid, f"instance {by_id[rid].instance}",
                                                     f"answered {by_id[rid].finished - killed_at:+.3f} s from the kill")
                 if rid in by_id else rid)
    rows = _rows_of(cluster, budget, budget_calls)
    assert sum((_cost(r) for r in rows), Decimal(0)) == budget["cap"]


@pytest.mark.slow
def test_a_database_restart_under_load_fails_only_closed_and_loses_no_row(
        cluster: Cluster, testserve: EmulatedProviders) -> None:
    """PostgreSQL stopped for 5 s and restarted while calls flow through all three instances: every
    call is 200 or a fail-closed 503 with Retry-After, and every call has its row once it is back."""
    caller = _caller(cluster, testserve, output_price="0.002")
    try:
        with Traffic(cluster, caller) as traffic:
            time.sleep(1.0)
            cluster.stop_database()
            time.sleep(5.0)
            cluster.start_database()
            time.sleep(2.0)
    finally:
        if not (cluster.pgdata / "postmaster.pid").exists():
            cluster.start_database()
    answers = traffic.answers
    failed = [x for x in answers if not (x.status == 200 or (x.status == 503 and x.retry_after is not None
                                                              and int(x.retry_after) >= 1))]
    assert not failed, failed[:5]
    answered = [x.request_id for x in answers if x.status == 200 and x.request_id]
    assert {x.instance for x in answers if x.status == 200} == {0, 1, 2}
    _stored_once(cluster, answered, 30)
    _rows_of(cluster, caller, len(answers), timeout_s=30)
