"""Scale-out (issue 15, "Speed"): what coordination costs when several meshfast instances share one
PostgreSQL. On a 2-core machine more instances cannot add throughput, so this measures the price of
coordinating instead, every contender side by side in one run, against floor_bench's fast upstream
(nginx answering a fixed 1.7 KB OpenAI stream), every gateway on Granian's default runtime (event loop
`auto`, task implementation `asyncio`) and on the working tree's sources and extension:

- `lone`: one `meshfast serve --workers W` alone on its PostgreSQL: it holds every cap whole and its
  calls never touch the database;
- `cluster`: three instances on one other PostgreSQL: `cluster-a` (W workers, the one measured) and
  `cluster-b`, `cluster-c` (`--idle-workers`, default 1, so the three fit 2 cores), registered and
  beating, idle unless a phase says otherwise. The first creates secrets.json, which is copied into the
  others' data dirs before they start (tests/conftest.py's Cluster). With three registered, every
  instance is in cluster mode: each daily USD cap and hourly call cap is leased in slices;
- `direct`: nginx itself, the baseline of added latency.

Both PostgreSQL servers are the embedded one (pgserver), started by this script and passed to the
instances as DATABASE_URL; each instance logs in as its own superuser role (`lone`, `inst_a`, `inst_b`,
`inst_c`), so the server's log says whose each statement is.

Counting round trips: pgserver's PostgreSQL 16 ships no pg_stat_statements, so both servers log every
statement (`log_statement = all`, prefix `%n|%p|%u|%a|`: epoch with ms, backend pid, login role,
application) and this script reads the logs. One logged statement is one client round trip; asyncpg's
pool also sends a reset query when a connection goes back to the pool: counted too, and charged to what
that backend did just before (so is a transaction's BEGIN/COMMIT, to its first statement). Categories:
`lease_grant` (`meshfast_lease_grant`: the only database call a request can wait for), `cluster`
(heartbeat, reaping, declaring and returning leases, provider shares), `counters` (checkpoints), `rows`
(request-log ingest), `other` (config reconcile, leader jobs). `track_functions = pl` also counts
meshfast_lease_grant executions in pg_stat_user_functions: a cross-check at the end.

Phases:

1. `idle`: no calls for `--idle-s`: statements per second per instance and category (the heartbeats),
   and the CPU of each contender (workers, supervisor, its PostgreSQL).
2. `far`: the bench user (floor_bench's provisioning and policy: a $1,000,000 daily cap and 10^9 calls an
   hour, both leased in the cluster) calls `POST /v1/chat/completions`, non-streamed (floor_bench's
   request), through lone and cluster-a. One connection per target, back to back, `--b2b-rounds` rounds of
   `--b2b-duration` s per target, direct, lone and cluster taking turns (the order rotates; each slice
   opens with a few unrecorded calls). Short turns keep every target idle for less than 4 beats, so the
   cluster keeps its slices; both contenders see the same background, and the per-round p50 differences
   (with a bootstrap 95% interval) say whether the two are equal within noise. Then `resume`: after
   `--resume-idle-s` without calls (an instance idle for 4 beats gives its unused slices back), `--resume-s`
   s back to back through each contender: the latency of the first second and after, and when the grants
   came. Then wrk `-c --connections` per contender (`--wrk-rounds`, alternating; wrk's warm-up, the same
   ramp, kept apart): req/s, the serving workers' CPU per call and the CPU of every process of the
   contender (its other instances and PostgreSQL included). Statements in each window, above the idle
   rate, per 1,000 calls; the longest gap between the measured instance's heartbeats.
3. `near`: a model priced so a call costs exactly its worst case ($0.004: input free, `max_tokens` 4,
   answered in 4 tokens at $1 per 1k) and, per trial, a fresh person whose daily cap fits `--near-calls`
   calls; calls back to back on one connection until refused (429), through lone, through cluster-a,
   and spread round-robin over a, b and c (until each refuses in turn). In the cluster an instance can be
   refused with less than two calls' worth still unused, split between its own slice and the allowance;
   so after the refusals the cluster trials wait 7 s (4 idle beats return the slices) and call again
   until refused. Reported: latency of the admitted calls, calls admitted against the cap before the
   first refusal and in all (recorded spend from request_logs: never past the cap), lease grants per
   1,000 calls overall and by how many calls' worth were left under the cap, and what a call that
   waited for a grant took.
4. `return`: per trial, a fresh person whose cap fits `--return-calls` calls makes `--return-used` calls
   through cluster-b (which leases a slice), then nothing. From the end of the last call: the time until
   b's unused part is back in the allowance (b's `leases.amount` = what b spent; polled every 50 ms), and
   the time until a call through cluster-a whose worst case is the whole rest of the cap is admitted
   (probed every 100 ms).

    .venv/bin/python bench/cluster_bench.py            # full: ~5.5 min
    .venv/bin/python bench/cluster_bench.py --quick    # smoke check (~1.5 min)
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import datetime as dt
import hashlib
import json
import os
import random
import re
import secrets
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import floor_bench as fb  # noqa: E402
from bench import harness, loadgen  # noqa: E402
from bench import proxy_bench as pb  # noqa: E402
from bench.harness import BenchError, Server  # noqa: E402

RESULTS_DIR = ROOT / "bench" / "results"
PHASES = ("idle", "far", "near", "return")

# The near-cap model: input free, output $1 per 1k tokens; a call asks for 4 tokens and nginx's fixed
# answer reports 4, so each call costs exactly its worst case.
NEAR_MODEL = "c-near"
NEAR_MAX_TOKENS = 4
CALL_USD = Decimal("0.004")
NANO = 1_000_000_000
NEAR_REQUEST = (b'{"model":"%s","max_tokens":%d,"messages":[{"role":"user","content":"hello"}]}')
# Calls' worth left under the cap when a call was sent: the bins grants are counted in.
LEFT_BINS = ((1000, None), (100, 999), (10, 99), (1, 9))
TOP_UP_IDLE_S = 7.0
# Unrecorded calls at each back-to-back slice's start (the connection and target sat idle meanwhile).
PRIMER_CALLS = 5
BOOTSTRAP = 2000
RETURN_TIMEOUT_S = 40.0
# cluster.IDLE_BEATS beats of 1 s: what the lease-return trial expects (reported, not enforced).
EXPECTED_RETURN_S = 5.0
GOAL_RETURN_S = 10.0  # the issue: an unused lease returns within 10 s

BENCH_APP = "cluster-bench"
LOG_PREFIX = "%n|%p|%u|%a|"
PG_SETTINGS = {"log_statement": "all", "log_line_prefix": LOG_PREFIX, "log_parameter_max_length": "0",
               "log_min_error_statement": "panic", "track_functions": "pl"}
ROLES = {"lone": "lone", "cluster-a": "inst_a", "cluster-b": "inst_b", "cluster-c": "inst_c"}
INSTANCES = ("cluster-a", "cluster-b", "cluster-c")
CATEGORIES = ("lease_grant", "cluster", "counters", "rows", "other")

NOTE = (
    "Everything (nginx, four gateways, two PostgreSQL servers, the load generator, wrk) shares this machine's CPUs "
    "unpinned with whatever else runs on it (each phase's cpu.other_busy_pct). Added latency is a difference of "
    "percentiles (target pN - direct pN). Database round trips are statements in the servers' logs "
    "(log_statement = all on both servers, so logging costs the same on each side); a window's statements above "
    "the idle rate are its count minus the idle phase's rate per category times the window. cluster-b and "
    "cluster-c run with --idle-workers workers and take no calls outside the near (spread) and return phases."
)


# --------------------------------------------------------------------------------- PostgreSQL

_RUNNER: asyncio.Runner | None = None


def _run(coro):
    """The script's one event loop, for its own database connections."""
    global _RUNNER
    if _RUNNER is None:
        _RUNNER = asyncio.Runner()
    return _RUNNER.run(coro)


STATEMENT_LINE = re.compile(r"^(\d+\.\d+)\|(\d+)\|([^|]*)\|([^|]*)\|(\w+):  (.*)$")
STATEMENT_TEXT = re.compile(r"^(?:statement|execute [^:]*): (.*)$", re.S)


def classify(sql: str) -> str:
    """What a statement is part of (transaction control and the pool's reset are resolved by the caller)."""
    head = sql.lstrip().lower()
    if head.startswith(("begin", "start transaction")):
        return "begin"
    if head.startswith(("commit", "rollback", "end")):
        return "end"
    if head.startswith("select pg_advisory_unlock_all()"):
        return "reset"
    if "meshfast_lease_grant" in head:
        return "lease_grant"
    if any(t in head for t in ("request_log", "copy ")):
        return "rows"
    if any(t in head for t in (" instances", "leases", "allowances", "provider_shares", "cluster_secrets",
                               "pg_advisory_xact_lock($1)")):
        return "cluster"
    if any(t in head for t in ("daily_spend", "hourly_usage", "rule_window", "counter")):
        return "counters"
    return "other"


@dataclass
class Statement:
    t: float  # epoch seconds (ms resolution)
    role: str
    category: str
    head: str


class StatementLog:
    """The statements in a PostgreSQL server's log, read incrementally and categorised: a transaction's
    BEGIN and COMMIT go with its first statement, the pool's reset with what the backend did before."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.statements: list[Statement] = []
        self.times: list[float] = []
        self._last: dict[int, str] = {}  # backend pid -> category of its last statement
        self._txn: dict[int, str | None] = {}  # backend pid -> category of the open transaction ("?": not yet)
        self._pending: dict[int, list[tuple[float, str, str]]] = {}
        self._entry: list | None = None  # the statement being read (continuation lines)
        self.beats: dict[str, list[float]] = {}  # role -> times of its heartbeat statement

    def read(self) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return
        cut = data.rfind(b"\n") + 1
        self.offset += cut
        for line in data[:cut].decode(errors="replace").split("\n"):
            m = STATEMENT_LINE.match(line)
            if m:
                self._flush()
                text = STATEMENT_TEXT.match(m.group(6)) if m.group(5) == "LOG" else None
                if text and m.group(4) != BENCH_APP and m.group(3) in ROLES.values():
                    self._entry = [float(m.group(1)), int(m.group(2)), m.group(3), text.group(1)]
            elif self._entry is not None and line.startswith("\t"):
                if len(self._entry[3]) < 600:
                    self._entry[3] += " " + line.strip()
            elif line:
                self._flush()
        self._flush()

    def _flush(self) -> None:
        if self._entry is None:
            return
        t, pid, role, sql = self._entry
        self._entry = None
        kind = classify(sql)
        head = " ".join(sql.split())[:160]
        if kind == "begin":
            self._txn[pid] = "?"
            self._pending.setdefault(pid, []).append((t, role, head))
            return
        if kind == "end":
            cat = self._txn.get(pid)
            cat = self._last.get(pid, "other") if cat in (None, "?") else cat
            self._add_pending(pid, cat)
            self._add(t, role, cat, head)
            self._txn[pid] = None
            self._last[pid] = cat
            return
        if kind == "reset":
            self._add(t, role, self._last.get(pid, "other"), head)
            return
        if head.startswith("UPDATE instances SET last_seen"):
            bisect.insort(self.beats.setdefault(role, []), t)
        txn = self._txn.get(pid)
        if txn == "?":
            self._txn[pid] = txn = kind
            self._add_pending(pid, kind)
        cat = txn or kind
        self._add(t, role, cat, head)
        self._last[pid] = cat

    def _add_pending(self, pid: int, cat: str) -> None:
        for t, role, head in self._pending.pop(pid, []):
            self._add(t, role, cat, head)

    def _add(self, t: float, role: str, cat: str, head: str) -> None:
        i = bisect.bisect_right(self.times, t)
        self.times.insert(i, t)
        self.statements.insert(i, Statement(t, role, cat, head))

    def between(self, t0: float, t1: float) -> list[Statement]:
        self.read()
        return self.statements[bisect.bisect_left(self.times, t0):bisect.bisect_right(self.times, t1)]

    def max_beat_gap(self, role: str, t0: float, t1: float) -> float | None:
        """The longest time between two of `role`'s heartbeats around [t0, t1] (an instance leader's event
        loop that falls behind declares ahead late)."""
        self.read()
        beats = self.beats.get(role, [])
        i = max(0, bisect.bisect_left(beats, t0) - 1)
        j = min(len(beats), bisect.bisect_right(beats, t1) + 1)
        near = beats[i:j]
        return round(max(b - a for a, b in zip(near, near[1:], strict=False)), 2) if len(near) > 1 else None

    def count(self, t0: float, t1: float) -> dict[str, dict[str, int]]:
        """{role: {category: statements}} in [t0, t1]."""
        out: dict[str, Counter] = {}
        for s in self.between(t0, t1):
            out.setdefault(s.role, Counter())[s.category] += 1
        return {role: dict(c) for role, c in sorted(out.items())}


class Postgres:
    """An embedded PostgreSQL (pgserver) started by this script: every statement logged, a login role
    per instance, the script's own connection (its statements left out of every count)."""

    def __init__(self, name: str, pgdata: Path, roles: list[str]) -> None:
        self.name = name
        self.pgdata = pgdata
        self.roles = roles
        self.url = ""
        self._pg = None
        self._conn = None
        self.log = StatementLog(pgdata / "log")
        self.settings: dict[str, str] = {}

    def start(self) -> None:
        from meshfast.store.database import EmbeddedPostgres

        self._pg = EmbeddedPostgres(self.pgdata)
        self.url = self._pg.start()
        for name, value in PG_SETTINGS.items():
            self.query(f"ALTER SYSTEM SET {name} = '{value}'")
        self.query("SELECT pg_reload_conf()")
        for role in self.roles:
            self.query(f"CREATE ROLE {role} LOGIN SUPERUSER")
        time.sleep(0.5)  # the reload reaches the postmaster's children
        self.settings = {r["name"]: r["setting"] for r in self.query(
            "SELECT name, setting FROM pg_settings WHERE name = ANY($1::text[])", list(PG_SETTINGS))}
        self.settings["server_version"] = self.query("SHOW server_version")[0]["server_version"]

    def url_as(self, role: str) -> str:
        return self.url.replace("postgresql://postgres:@", f"postgresql://{role}:@", 1)

    def query(self, sql: str, *args) -> list[dict]:
        return _run(self._query(sql, *args))

    async def _query(self, sql: str, *args) -> list[dict]:
        import asyncpg

        if self._conn is None or self._conn.is_closed():
            self._conn = await asyncpg.connect(self.url, server_settings={"application_name": BENCH_APP})
        return [dict(r) for r in await self._conn.fetch(sql, *args)]

    def grant_calls(self) -> int | None:
        rows = self.query("SELECT calls FROM pg_stat_user_functions WHERE funcname = 'meshfast_lease_grant'")
        return int(rows[0]["calls"]) if rows else 0

    def stop(self) -> None:
        if self._conn is not None:
            try:
                _run(self._conn.close())
            except Exception:  # noqa: BLE001 - the server may already be gone
                pass
            self._conn = None
        if self._pg is not None:
            self._pg.stop()
            self._pg = None


# ------------------------------------------------------------------------------------- servers


@dataclass
class Gateway:
    name: str
    role: str
    workers: int
    url: str
    data_dir: str
    server: Server
    db: Postgres
    instance_id: str | None = None


@dataclass
class ClusterStack:
    """nginx, two PostgreSQL servers, the lone gateway and the three instances; proxy_bench's groups for
    the CPU split (servers by session, PostgreSQL by data dir)."""

    upstream: Server
    upstream_url: str
    dbs: dict[str, Postgres]
    gateways: dict[str, Gateway]
    admin_token: str
    groups: pb.Groups = field(default_factory=pb.Groups)
    setup: dict = field(default_factory=dict)
    user_key: str = ""
    user_keys: list[str] = field(default_factory=list)
    near_model_ids: dict[str, str] = field(default_factory=dict)  # database -> the near-cap model's id

    def servers(self) -> list[Server]:
        return [self.upstream, *(g.server for g in self.gateways.values())]

    def secrets(self) -> list[str]:
        return [s for s in (self.admin_token, self.user_key, *self.user_keys) if s]

    def check_alive(self) -> None:
        for s in self.servers():
            s.check_alive()

    def admin(self, gw: str, method: str, path: str, body: object | None = None) -> dict:
        status, _, raw = harness.http_request(method, self.gateways[gw].url + path,
                                              {"authorization": f"Bearer {self.admin_token}"}, body, timeout_s=30.0)
        if status not in (200, 201, 204):
            raise BenchError(f"{gw}: {method} {path} answered {status}: {raw[:500]!r}")
        return json.loads(raw) if raw else {}

    def stop_into(self, doc: dict) -> None:
        doc["server_log_tails"] = {s.name: harness.redact([s.log_tail(3000)], self.secrets())[0] for s in self.servers()}
        report: dict = {}
        # The idle instances first, so the measured one is the last to leave (no mode switches meanwhile).
        for name in ("cluster-c", "cluster-b", "cluster-a", "lone"):
            gw = self.gateways.get(name)
            if gw is not None:
                report[name] = gw.server.stop()
        report["upstream"] = self.upstream.stop()
        for name, db in self.dbs.items():
            try:
                db.stop()
                report[f"{name}_stopped"] = True
            except Exception as exc:  # noqa: BLE001 - reported; the data dir is removed anyway
                report[f"{name}_stopped"] = repr(exc)
        for gw in self.gateways.values():
            shutil.rmtree(gw.data_dir, ignore_errors=True)
        doc["stop"] = report


def _wait_ready(gw: Gateway) -> float:
    def ready() -> bool:
        if harness.http_request("GET", gw.url + "/readyz", timeout_s=2.0)[0] != 200:
            return False
        return len(fb.worker_pids(gw.server)) == gw.workers

    return harness.wait_until(ready, pb.MESHFAST_READY_TIMEOUT_S, gw.server, "GET /readyz == 200 and every worker up")


def start_stack(args, work_dir: Path) -> ClusterStack:
    env = fb.server_env(argparse.Namespace(loop=None))
    env.pop("DATABASE_URL", None)
    for var in ("MESHFAST_LOOP", "MESHFAST_TASK_IMPL", "MESHFAST_RUNTIME_MODE"):
        env.pop(var, None)  # Granian's defaults for every gateway alike
    port = harness.free_port()
    conf = work_dir / "nginx.conf"
    conf.write_text(fb.nginx_conf(work_dir, port, args.upstream_workers))
    upstream = harness.nginx_server(work_dir, conf, env)
    dbs = {"pg-lone": Postgres("pg-lone", work_dir / "pg-lone", ["lone"]),
           "pg-cluster": Postgres("pg-cluster", work_dir / "pg-cluster", [ROLES[n] for n in INSTANCES])}
    st = ClusterStack(upstream=upstream, upstream_url=f"http://127.0.0.1:{port}", dbs=dbs, gateways={},
                      admin_token=secrets.token_urlsafe(32))
    try:
        t0 = time.monotonic()
        for db in dbs.values():
            db.start()
            st.groups.data_dirs[db.name] = str(db.pgdata)
        st.setup["postgres_s"] = round(time.monotonic() - t0, 2)
        st.setup["postgres_settings"] = {name: db.settings for name, db in dbs.items()}
        upstream.start()
        st.groups.sessions["upstream"] = upstream.proc.pid
        st.setup["upstream_ready_s"] = harness.wait_until(lambda: fb._answers(st.upstream_url + "/healthz"), 30.0,
                                                          upstream, "an answer")
        for name in ("lone", *INSTANCES):
            workers = args.workers if name in ("lone", "cluster-a") else args.idle_workers
            db = dbs["pg-lone" if name == "lone" else "pg-cluster"]
            data_dir = tempfile.mkdtemp(prefix=f"meshfast-{name}-", dir=work_dir)
            gw_port = harness.free_port()
            mf_env = dict(env, MESHFAST_DATA_DIR=data_dir, MESHFAST_ADMIN_TOKEN=st.admin_token,
                          DATABASE_URL=db.url_as(ROLES[name]))
            server = Server(name, shlex.split(args.meshfast_cmd) + [
                "serve", "--workers", str(workers), "--host", "127.0.0.1", "--port", str(gw_port)],
                mf_env, work_dir / f"{name}.log")
            st.gateways[name] = Gateway(name, ROLES[name], workers, f"http://127.0.0.1:{gw_port}", data_dir, server, db)
        # The lone gateway and the cluster's first instance (it migrates the cluster's database and
        # creates the secrets); then the others, with its secrets.json.
        for name in ("lone", "cluster-a"):
            gw = st.gateways[name]
            gw.server.start()
            st.groups.sessions[name] = gw.server.proc.pid
        for name in ("lone", "cluster-a"):
            st.setup[f"{name}_ready_s"] = _wait_ready(st.gateways[name])
        first = Path(st.gateways["cluster-a"].data_dir) / "secrets.json"
        for name in INSTANCES[1:]:
            gw = st.gateways[name]
            shutil.copy2(first, Path(gw.data_dir) / "secrets.json")
            gw.server.start()
            st.groups.sessions[name] = gw.server.proc.pid
        for name in INSTANCES[1:]:
            st.setup[f"{name}_ready_s"] = _wait_ready(st.gateways[name])
        st.setup["cluster_mode_s"] = harness.wait_until(lambda: _whole_cluster(st), 30.0, st.gateways["cluster-a"].server,
                                                        "all three instances alive in cluster mode")
        listed = _instances(st, "cluster-a")
        for name in INSTANCES:
            gw = st.gateways[name]
            gw.instance_id = next(e["id"] for e in listed if e["port"] == int(gw.url.rsplit(":", 1)[1]))
        st.setup["instances"] = listed
        provision(st)
    except BaseException:
        st.stop_into({})
        raise
    return st


def _instances(st: ClusterStack, gw: str) -> list[dict]:
    return st.admin(gw, "GET", "/admin/status").get("instances") or []


def _whole_cluster(st: ClusterStack) -> bool:
    listed = _instances(st, "cluster-a")
    ports = {int(st.gateways[n].url.rsplit(":", 1)[1]) for n in INSTANCES}
    live = {e["port"] for e in listed if e["alive"] and e["mode"] == "cluster"}
    return ports <= live


def provision(st: ClusterStack) -> None:
    """floor_bench's provisioning on lone and on the cluster (through cluster-a): one provider on nginx,
    its priced model and the governed bench user; plus the near-cap model, granted per trial."""
    t0 = time.monotonic()
    for name in ("lone", "cluster-a"):
        gw = st.gateways[name]
        fs = fb.FloorStack(meshfast=gw.server, meshfast_url=gw.url, admin_token=st.admin_token,
                           urls={"upstream": st.upstream_url})
        fb.provision(fs)
        st.user_keys.append(fs.user_key)
        st.setup[f"{name}_provision"] = fs.setup
        provider = next(p for p in st.admin(name, "GET", "/admin/providers") if p["name"] == "f-openai")
        near = harness.admin_create(gw.url, st.admin_token, "/admin/models", {
            "provider_id": provider["id"], "name": NEAR_MODEL, "resolved_model": fb.RESOLVED, "kind": "chat",
            "input_price_per_1k_tokens": "0", "output_price_per_1k_tokens": "1", "verify": False})
        st.near_model_ids[gw.db.name] = near["id"]
    # Each database made its own bench user: lone's key first, the cluster's second.
    st.user_key = st.user_keys[0]
    for name in INSTANCES:
        st.setup[f"bench_user_on_{name}_s"] = _wait_serves(st, name, st.user_keys[1], fb.MODEL,
                                                           Decimal(str(pb.BUDGET_POLICY["daily_cap_usd"])))
    st.setup["provision_s"] = round(time.monotonic() - t0, 2)


def _serves(url: str, key: str, model: str, cap: Decimal) -> bool:
    status, _, raw = harness.http_request("GET", url + "/v1/usage", {"authorization": f"Bearer {key}"}, timeout_s=5.0)
    if status != 200:
        return False
    entry = next((u for u in json.loads(raw).get("usage", []) if u.get("model") == model), None)
    return entry is not None and Decimal(str(entry.get("daily_cap_usd"))) == cap


def _wait_serves(st: ClusterStack, gw: str, key: str, model: str, cap: Decimal) -> float:
    """Until several fresh connections in a row (any worker) serve the caller with its cap."""
    seen = 0

    def ok() -> bool:
        nonlocal seen
        seen = seen + 1 if _serves(st.gateways[gw].url, key, model, cap) else 0
        return seen >= pb.PROPAGATION_CONFIRMATIONS

    return harness.wait_until(ok, pb.CONFIG_PROPAGATION_TIMEOUT_S, st.gateways[gw].server, f"{model} with its cap on {gw}")


# ------------------------------------------------------------------------------------ counting


def _rates(counts: dict[str, dict[str, int]], seconds: float) -> dict[str, dict[str, float]]:
    return {role: {cat: round(n / seconds, 2) for cat, n in c.items()} for role, c in counts.items()}


def _sum_roles(counts: dict[str, dict[str, int]], roles: list[str]) -> dict[str, float]:
    out: Counter = Counter()
    for role in roles:
        out.update(counts.get(role, {}))
    return dict(out)


def _above_idle(counts: dict[str, float], idle_rate: dict[str, float], seconds: float) -> dict[str, float]:
    return {cat: round(counts.get(cat, 0) - idle_rate.get(cat, 0) * seconds, 1) for cat in CATEGORIES}


def contender_roles(contender: str) -> tuple[str, list[str]]:
    """The database and login roles of a contender: lone, or the whole cluster."""
    if contender == "lone":
        return "pg-lone", ["lone"]
    return "pg-cluster", [ROLES[n] for n in INSTANCES]


@dataclass
class Window:
    t0: float
    t1: float
    calls: int

    @property
    def seconds(self) -> float:
        return self.t1 - self.t0


def statements_report(st: ClusterStack, contender: str, windows: list[Window], idle: dict | None) -> dict:
    """Statements of the contender's database in its windows: per category, per 1,000 calls, above idle."""
    db_name, roles = contender_roles(contender)
    db = st.dbs[db_name]
    total: Counter = Counter()
    per_role: dict[str, Counter] = {}
    # When in its window each lease grant ran (0.5 s buckets from the window's start, summed over windows).
    grant_at: Counter = Counter()
    bursts: list[dict] = []
    for w in windows:
        c = db.log.count(w.t0, w.t1)
        for role, cats in c.items():
            if role in roles:
                total.update(cats)
                per_role.setdefault(role, Counter()).update(cats)
        for role in roles:
            times = _grant_calls_in(db, role, w.t0, w.t1)
            for t in times:
                grant_at[f"{0.5 * int((t - w.t0) / 0.5):.1f}"] += 1
            if times and len(bursts) < 10:
                # What the instance's backends did just before the first grant (rows left out).
                context = [[round(x.t - times[0], 3), x.category, x.head[:70]]
                           for x in db.log.between(times[0] - 1.5, times[0] + 0.05)
                           if x.role == role and x.category not in ("rows", "lease_grant")]
                bursts.append({"role": role, "window_start": dt.datetime.fromtimestamp(w.t0, dt.UTC).isoformat(),
                               "first_grant_s": round(times[0] - w.t0, 3), "last_grant_s": round(times[-1] - w.t0, 3),
                               "grants": len(times), "before_first": context[-12:]})
    calls = sum(w.calls for w in windows)
    seconds = sum(w.seconds for w in windows)
    rate = (idle or {}).get("rate_by_db", {}).get(db_name, {})
    above = _above_idle(dict(total), rate, seconds)

    def per_k(x: float) -> float | None:
        return round(1000 * x / calls, 2) if calls else None

    gaps = {r: [g for w in windows if (g := db.log.max_beat_gap(r, w.t0, w.t1)) is not None] for r in roles}
    return {"calls": calls, "seconds": round(seconds, 2), "statements": dict(total),
            "max_beat_gap_s": {r: max(g) for r, g in gaps.items() if g},
            "by_role": {r: dict(c) for r, c in per_role.items()},
            "lease_grants": total.get("lease_grant", 0),
            "grant_executions_by_offset_s": dict(sorted(grant_at.items(), key=lambda kv: float(kv[0]))),
            "grant_bursts": bursts,
            "lease_grant_statements_per_1k_calls": per_k(total.get("lease_grant", 0)),
            "above_idle": above,
            "above_idle_per_1k_calls": {cat: per_k(v) for cat, v in above.items()},
            "coordination_above_idle_per_1k_calls": per_k(above["lease_grant"] + above["cluster"])}


def _grant_calls_in(db: Postgres, role: str, t0: float, t1: float) -> list[float]:
    """Times of meshfast_lease_grant executions by `role` in [t0, t1] (their pool resets left out)."""
    return [s.t for s in db.log.between(t0, t1)
            if s.role == role and s.category == "lease_grant" and "meshfast_lease_grant" in s.head]


# ---------------------------------------------------------------------------------------- phases


def phase_idle(args, st: ClusterStack) -> dict:
    time.sleep(1.0)
    meter = pb.CpuMeter(st.groups)
    t0 = time.time()
    time.sleep(args.idle_s)
    t1 = time.time()
    cpu = meter.stop()
    time.sleep(0.3)
    out: dict = {"seconds": round(t1 - t0, 2), "cpu": cpu, "rate_by_db": {}, "per_second": {}}
    for name, db in st.dbs.items():
        counts = db.log.count(t0, t1)
        out["per_second"][name] = _rates(counts, t1 - t0)
        roles = [r for r in counts]
        summed = _sum_roles(counts, roles)
        out["rate_by_db"][name] = {cat: round(summed.get(cat, 0) / (t1 - t0), 3) for cat in CATEGORIES}
        out[f"{name}_statements_per_s"] = round(sum(summed.values()) / (t1 - t0), 2)
    wall = cpu["wall_s"]
    cs = cpu["cpu_s"]
    out["cpu_pct"] = {
        "lone": round(100 * (cs.get("lone", 0) + cs.get("pg-lone", 0)) / wall, 2),
        "cluster": round(100 * (sum(cs.get(n, 0) for n in INSTANCES) + cs.get("pg-cluster", 0)) / wall, 2),
        **{n: round(100 * cs.get(n, 0) / wall, 2) for n in ("lone", *INSTANCES, "pg-lone", "pg-cluster")}}
    return out


def _targets(st: ClusterStack) -> dict[str, loadgen.Target]:
    up_auth = {"authorization": f"Bearer {fb.UPSTREAM_KEY}", "content-type": "application/json"}
    body = fb.CHAT_REQUEST % fb.MODEL.encode()
    targets = {"direct": loadgen.Target.post("direct", f"{st.upstream_url}/sse/v1/chat/completions", up_auth,
                                             fb.STREAM_REQUEST % fb.RESOLVED.encode(), fb.SSE_END)}
    for contender, gw, key in (("lone", "lone", st.user_keys[0]), ("cluster", "cluster-a", st.user_keys[1])):
        targets[contender] = loadgen.Target.post(
            contender, f"{st.gateways[gw].url}/v1/chat/completions",
            {"authorization": f"Bearer {key}", "content-type": "application/json"}, body, fb.JSON_END)
    for t in targets.values():
        pb._exchange_once(t)
    return targets


def _b2b(conn: loadgen.Conn, target: loadgen.Target, series: loadgen.Series, seconds: float) -> Window:
    t0 = time.time()
    n0 = len(series.total_ns) + len(series.errors)
    stop = time.perf_counter_ns() + int(seconds * 1e9)
    while time.perf_counter_ns() < stop:
        loadgen._one(conn, target, series, None, 0)
    return Window(t0, time.time(), len(series.total_ns) + len(series.errors) - n0)


def phase_resume(args, st: ClusterStack, targets: dict[str, loadgen.Target], idle: dict | None) -> dict:
    """Traffic after a pause: --resume-idle-s without calls (the cluster's idle slices go back after 4
    beats), then --resume-s back to back through cluster-a and then lone; when the grants came."""
    series = {c: loadgen.Series(c) for c in ("lone", "cluster")}
    first_s = {c: loadgen.Series(c) for c in series}
    windows: dict[str, list[Window]] = {c: [] for c in series}
    print(f"[cluster] resume after {args.resume_idle_s:g} s idle: {args.resume_trials} x {args.resume_s:g} s ...",
          flush=True)
    for _ in range(args.resume_trials):
        time.sleep(args.resume_idle_s)
        for c in ("cluster", "lone"):
            conn = loadgen.Conn(targets[c].host, targets[c].port)
            try:
                windows[c].append(_b2b(conn, targets[c], first_s[c], 1.0))
                rest = _b2b(conn, targets[c], series[c], max(0.0, args.resume_s - 1.0))
                windows[c].append(rest)
            finally:
                conn.close()
        st.check_alive()
    time.sleep(0.3)
    out: dict = {"idle_s": args.resume_idle_s, "seconds": args.resume_s, "trials": args.resume_trials}
    for c in series:
        out[c] = {"first_second_us": loadgen.summarize_us(first_s[c].total_ns),
                  "after_us": loadgen.summarize_us(series[c].total_ns),
                  "errors": (first_s[c].errors + series[c].errors)[:5],
                  "statements": statements_report(st, c, windows[c], idle)}
    return out


def _paired(a: list[float | None], b: list[float | None], seed: int = 0) -> dict:
    """Per-round differences b - a: mean, median and a bootstrap 95% interval of the mean."""
    d = [y - x for x, y in zip(a, b, strict=True) if x is not None and y is not None]
    if len(d) < 2:
        return {"rounds": len(d)}
    rng = random.Random(seed)
    means = sorted(statistics.fmean(rng.choices(d, k=len(d))) for _ in range(BOOTSTRAP))
    return {"rounds": len(d), "mean_us": round(statistics.fmean(d), 1), "median_us": round(statistics.median(d), 1),
            "ci95_us": [round(means[int(0.025 * BOOTSTRAP)], 1), round(means[int(0.975 * BOOTSTRAP) - 1], 1)],
            "b_slower_rounds": sum(x > 0 for x in d)}


def phase_far(args, st: ClusterStack, idle: dict | None, work_dir: Path) -> dict:
    targets = _targets(st)
    names = tuple(targets)
    # A warm-up per target: the first lease of each cap, pools, caches.
    for t in targets.values():
        loadgen.back_to_back(t, args.warmup_s, warmup_requests=0)
    conns = {n: loadgen.Conn(targets[n].host, targets[n].port) for n in names}
    steady = {n: loadgen.Series(n) for n in names}
    windows: dict[str, list[Window]] = {n: [] for n in names}
    round_p50: dict[str, list[float | None]] = {n: [] for n in names}
    meter = pb.CpuMeter(st.groups)
    print(f"[cluster] far from the cap, one connection: {args.b2b_rounds} x {args.b2b_duration:g} s x {len(names)} "
          "...", flush=True)
    try:
        # NOTE: short slices taking turns keep each target idle for less than cluster.IDLE_BEATS beats, so the
        # cluster's slices stay with it (their return after a pause is measured apart, below).
        for r in range(args.b2b_rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            for name in order:
                primer = loadgen.Series(name)
                for _ in range(PRIMER_CALLS):
                    loadgen._one(conns[name], targets[name], primer, None, 0)
                steady[name].errors += [f"slice primer: {e}" for e in primer.errors]
                part = loadgen.Series(name)
                windows[name].append(_b2b(conns[name], targets[name], part, args.b2b_duration))
                round_p50[name].append(round(loadgen.percentile(sorted(part.total_ns), 50) / 1000, 1)
                                       if part.total_ns else None)
                for f in ("total_ns", "service_ns", "head_ns", "first_body_ns", "backlog_ns", "errors"):
                    getattr(steady[name], f).extend(getattr(part, f))
                for k, v in part.statuses.items():
                    steady[name].statuses[k] = steady[name].statuses.get(k, 0) + v
            st.check_alive()
    finally:
        for c in conns.values():
            c.close()
    cpu = meter.stop()
    time.sleep(0.3)
    reports = {n: steady[n].report(raw=False) for n in names}
    fb._added(reports)
    out: dict = {"rounds": args.b2b_rounds, "duration_s_per_round": args.b2b_duration, "primer_calls": PRIMER_CALLS,
                 "cpu": cpu, "targets": reports, "round_p50_us": round_p50,
                 "paired_p50_cluster_minus_lone": _paired(round_p50["lone"], round_p50["cluster"]),
                 "statements": {c: statements_report(st, c, windows[c], idle) for c in ("lone", "cluster")}}
    out["resume"] = phase_resume(args, st, targets, idle)
    # wrk: req/s and CPU per call, contenders alternating per round; wrk's warm-up kept apart.
    runs: dict[str, list[dict]] = {"lone": [], "cluster": []}
    wrk_windows: dict[str, dict[str, list[Window]]] = {c: {"steady": [], "resume": []} for c in runs}
    for r in range(args.wrk_rounds):
        for contender in (("lone", "cluster") if r % 2 == 0 else ("cluster", "lone")):
            gw = st.gateways["lone" if contender == "lone" else "cluster-a"]
            print(f"[cluster] wrk -c{args.connections}: {contender} (round {r + 1}) ...", flush=True)
            marks: dict[str, float] = {}
            meter_start = fb.cpu_meter(fb.worker_pids(gw.server))

            def measure(meter_start=meter_start, marks=marks):
                marks["t0"] = time.time()
                stop = meter_start()

                def done() -> dict:
                    res = stop()
                    marks["t1"] = time.time()
                    return res

                return done

            t_begin = time.time()
            run = pb.run_wrk_target(args, work_dir, contender, targets[contender], st, measure=measure)
            cpu_w = run["worker_cpu"]
            run["worker_cpu_us_per_call"] = (round(cpu_w["total_cpu_s"] * 1e6 / run["wrk"]["requests"], 1)
                                             if run["wrk"]["requests"] else None)
            groups = run["cpu"]["cpu_s"]
            mine = ["lone", "pg-lone"] if contender == "lone" else [*INSTANCES, "pg-cluster"]
            run["contender_cpu_s"] = round(sum(groups.get(g, 0) for g in mine), 2)
            run["contender_cpu_us_per_call"] = (round(run["contender_cpu_s"] * 1e6 / run["wrk"]["requests"], 1)
                                                if run["wrk"]["requests"] else None)
            warm_calls = (run.get("warmup") or {}).get("requests", 0)
            wrk_windows[contender]["resume"].append(Window(t_begin, marks["t0"], warm_calls))
            wrk_windows[contender]["steady"].append(Window(marks["t0"], marks["t1"], run["wrk"]["requests"]))
            run.pop("wrk_stdout", None)
            runs[contender].append(run)
            st.check_alive()
    time.sleep(0.3)
    out["throughput"] = {"connections": args.connections, "threads": args.threads, "duration_s": args.wrk_duration,
                         "warmup_s": args.wrk_warmup, "rounds": args.wrk_rounds, "runs": runs,
                         "statements": {c: statements_report(st, c, wrk_windows[c]["steady"], idle) for c in runs},
                         "resume_statements": {c: statements_report(st, c, wrk_windows[c]["resume"], idle)
                                               for c in runs}}
    for c, rs in runs.items():
        out["throughput"][f"{c}_summary"] = {
            "requests_per_s": round(statistics.fmean(x["requests_per_s"] for x in rs), 1),
            "requests_per_s_rounds": [x["requests_per_s"] for x in rs],
            "worker_cpu_us_per_call": _mean([x["worker_cpu_us_per_call"] for x in rs]),
            "worker_cpu_us_per_call_rounds": [x["worker_cpu_us_per_call"] for x in rs],
            "contender_cpu_us_per_call": _mean([x["contender_cpu_us_per_call"] for x in rs]),
            "errors": sum(x["errors_total"] for x in rs)}
    return out


def _mean(xs: list) -> float | None:
    xs = [x for x in xs if x is not None]
    return round(statistics.fmean(xs), 1) if xs else None


# ------------------------------------------------------------------------------------------ near


def new_near_user(st: ClusterStack, via: str, cap_calls: int, tag: str) -> dict:
    """A fresh person with the near-cap model and a daily cap that fits `cap_calls` calls (no hourly cap)."""
    gw = st.gateways[via]
    user = harness.admin_create(gw.url, st.admin_token, "/admin/users",
                                {"email": f"{tag}@example.com", "display_name": tag})
    model = {"id": st.near_model_ids[gw.db.name]}
    cap = cap_calls * CALL_USD
    st.admin(via, "POST", "/admin/access", {"user_id": user["id"], "model_id": model["id"]})
    st.admin(via, "PUT", f"/admin/users/{user['id']}/policies/{model['id']}", {**pb.BUDGET_POLICY,
                                                                               "daily_cap_usd": str(cap)})
    st.user_keys.append(user["key"])
    return {"id": user["id"], "key": user["key"], "cap": cap, "cap_calls": cap_calls, "model_id": model["id"]}


def _near_target(st: ClusterStack, gw: str, key: str, max_tokens: int = NEAR_MAX_TOKENS) -> loadgen.Target:
    return loadgen.Target.post(gw, f"{st.gateways[gw].url}/v1/chat/completions",
                               {"authorization": f"Bearer {key}", "content-type": "application/json"},
                               NEAR_REQUEST % (NEAR_MODEL.encode(), max_tokens), fb.JSON_END)


@dataclass
class Call:
    gw: str
    t0: float
    t1: float
    status: int
    us: float
    left: int  # calls' worth left under the cap before it (admitted so far subtracted)


def _calls_until_refused(conns: dict[str, loadgen.Conn], targets: dict[str, loadgen.Target], cap_calls: int,
                         admitted: int, limit: int) -> tuple[list[Call], list[str]]:
    """Round-robin over the targets, one call at a time, until each refuses in a row (429)."""
    calls: list[Call] = []
    problems: list[str] = []
    order = list(targets)
    refused_in_a_row = 0
    i = 0
    while refused_in_a_row < len(order) and len(calls) < limit:
        name = order[i % len(order)]
        i += 1
        t0 = time.time()
        try:
            _, sample, tail = conns[name].exchange(targets[name])
        except (OSError, loadgen.LoadgenError, ValueError) as exc:
            conns[name].close()
            problems.append(f"{name}: {exc!r}")
            continue
        t1 = time.time()
        calls.append(Call(name, t0, t1, sample.status, round(sample.last_ns / 1000, 1), cap_calls - admitted))
        if sample.status == 200:
            admitted += 1
            refused_in_a_row = 0
            if fb.JSON_END not in tail:
                problems.append(f"{name}: a 200 without the end of the completion: {tail[-200:]!r}")
        elif sample.status == 429:
            refused_in_a_row += 1
            if b"budget_exceeded" not in tail:
                problems.append(f"{name}: a 429 that is not budget_exceeded: {tail[:200]!r}")
        else:
            problems.append(f"{name}: answered {sample.status}: {tail[:200]!r}")
            refused_in_a_row = 0
    if len(calls) >= limit:
        problems.append(f"no refusal after {limit} calls: the cap did not hold")
    return calls, problems


def _recorded(db: Postgres, user_id: str, calls: int, timeout_s: float = 30.0) -> dict:
    """The person's rows once they account for `calls` requests: 200s and their recorded spend."""
    sql = ("SELECT coalesce(sum(count), 0)::bigint AS calls, count(*) FILTER (WHERE status_code = 200) AS ok, "
           "coalesce(sum(input_cost + output_cost) FILTER (WHERE status_code = 200), 0) AS spend "
           "FROM request_logs WHERE user_id = $1::uuid")
    deadline = time.monotonic() + timeout_s
    while True:
        row = db.query(sql, user_id)[0]
        if row["calls"] >= calls or time.monotonic() > deadline:
            return {"rows_calls": int(row["calls"]), "rows_200": int(row["ok"]), "recorded_spend_usd": str(row["spend"])}
        time.sleep(0.3)


def near_trial(st: ClusterStack, args, mode: str, k: int) -> dict:
    """One person, a cap of --near-calls calls; calls until refused through lone, cluster-a, or spread."""
    via = "lone" if mode == "lone" else "cluster-a"
    gws = {"lone": ["lone"], "cluster": ["cluster-a"], "spread": list(INSTANCES)}[mode]
    tag = f"near-{mode}-{k}-{secrets.token_hex(3)}"
    user = new_near_user(st, via, args.near_calls, tag)
    for gw in gws:
        _wait_serves(st, gw, user["key"], NEAR_MODEL, user["cap"])
    targets = {gw: _near_target(st, gw, user["key"]) for gw in gws}
    conns = {gw: loadgen.Conn(t.host, t.port) for gw, t in targets.items()}
    db = st.dbs["pg-lone" if mode == "lone" else "pg-cluster"]
    pids = [p for gw in gws for p in fb.worker_pids(st.gateways[gw].server)]
    cpu_start = fb.cpu_meter(pids)
    try:
        stop_cpu = cpu_start()
        t_start = time.time()
        calls, problems = _calls_until_refused(conns, targets, args.near_calls, 0, 3 * args.near_calls + 30)
        t_end = t_first_end = time.time()
        cpu = stop_cpu()
        topped: list[Call] = []
        if mode != "lone":
            # Room stranded in slices (an instance's declared or undeclared rest, each less than a call's
            # worth, while the allowance has less than a call's worth left) returns after 4 idle beats.
            time.sleep(TOP_UP_IDLE_S)
            admitted = sum(c.status == 200 for c in calls)
            topped, more = _calls_until_refused(conns, targets, args.near_calls, admitted, 3 * args.near_calls)
            problems += more
            t_end = time.time()
    finally:
        for c in conns.values():
            c.close()
    time.sleep(0.3)
    everything = calls + topped
    admitted = [c for c in everything if c.status == 200]
    first_refusal = next((c for c in calls if c.status == 429), None)
    # Lease grants (their executions, not the pool resets) matched to the call in flight when each ran.
    roles = [ROLES[g] for g in gws]
    grants = sorted(t for r in roles for t in _grant_calls_in(db, r, t_start - 0.002, t_end + 0.002))
    starts = [c.t0 for c in everything]
    per_call = [0] * len(everything)
    unmatched = 0
    for t in grants:
        i = bisect.bisect_right(starts, t + 0.0015) - 1  # the log's clock has ms resolution
        if 0 <= i < len(everything) and t <= everything[i].t1 + 0.0015:
            per_call[i] += 1
        else:
            unmatched += 1
    bins = []
    for lo, hi in LEFT_BINS:
        idx = [i for i, c in enumerate(everything) if c.status == 200 and c.left >= lo and (hi is None or c.left <= hi)]
        g = sum(per_call[i] for i in idx)
        bins.append({"left_calls": f"{lo}+" if hi is None else f"{lo}-{hi}", "calls": len(idx), "grants": g,
                     "grants_per_1k_calls": round(1000 * g / len(idx), 1) if idx else None})
    refused_idx = [i for i, c in enumerate(everything) if c.status == 429]
    with_grant = [everything[i].us for i in range(len(everything)) if everything[i].status == 200 and per_call[i]]
    without = [everything[i].us for i in range(len(everything)) if everything[i].status == 200 and not per_call[i]]
    lat = sorted(c.us for c in admitted)
    recorded = _recorded(db, user["id"], len(everything))
    spent = Decimal(recorded["recorded_spend_usd"])
    stmts = statements_report(st, "lone" if mode == "lone" else "cluster", [Window(t_start, t_end, len(everything))],
                              None)
    return {
        "mode": mode, "repeat": k, "instances": gws, "cap_calls": args.near_calls, "cap_usd": str(user["cap"]),
        "calls": len(everything), "admitted": len(admitted), "refused": len(refused_idx),
        "admitted_before_first_refusal": sum(c.status == 200 for c in calls[:calls.index(first_refusal)])
        if first_refusal else None,
        "topped_up_after_idle": sum(c.status == 200 for c in topped),
        "idle_before_top_up_s": TOP_UP_IDLE_S if mode != "lone" else None,
        "admitted_by_instance": dict(Counter(c.gw for c in admitted)),
        "seconds": round(t_end - t_start, 2),
        "first_pass_s": round(t_first_end - t_start, 2),
        "calls_per_s_first_pass": round(len(calls) / (t_first_end - t_start), 1),
        "latency_us": loadgen.summarize_us([int(c.us * 1000) for c in admitted]),
        "p50_us": lat[len(lat) // 2] if lat else None,
        "latency_with_grant_us": loadgen.summarize_us([int(x * 1000) for x in with_grant]),
        "latency_without_grant_us": loadgen.summarize_us([int(x * 1000) for x in without]),
        "lease_grants": len(grants), "grants_unmatched": unmatched,
        "grants_on_refused_calls": sum(per_call[i] for i in refused_idx),
        "lease_grants_per_1k_admitted": round(1000 * sum(per_call[i] for i in range(len(everything))
                                                         if everything[i].status == 200) / len(admitted), 2)
        if admitted else None,
        "grants_by_calls_left": bins,
        "statements": stmts,
        "worker_cpu_us_per_call": round(cpu["total_cpu_s"] * 1e6 / len(everything), 1) if everything else None,
        **recorded,
        "over_cap_usd": str(max(Decimal(0), spent - user["cap"])),
        "filled_exactly": spent == user["cap"],
        "problems": problems,
        # Per call, compactly: which instance took it (a letter each), the calls that waited for grants
        # (index, grants), the refusals, and HDR histograms of the latencies (loadgen's encoding).
        "instance_of_call": "".join("l" if c.gw == "lone" else c.gw[-1] for c in everything),
        "grants_at_call": [[i, n] for i, n in enumerate(per_call) if n],
        "refused_at_call": refused_idx,
        **loadgen.hdr_report({"admitted_us": [int(c.us * 1000) for c in admitted],
                              "with_grant_us": [int(x * 1000) for x in with_grant],
                              "without_grant_us": [int(x * 1000) for x in without]}),
    }


def phase_near(args, st: ClusterStack) -> dict:
    trials = []
    for k in range(args.near_repeats):
        for mode in (("lone", "cluster", "spread") if k % 2 == 0 else ("spread", "cluster", "lone")):
            print(f"[cluster] near the cap: {mode} #{k} (cap {args.near_calls} calls) ...", flush=True)
            t = near_trial(st, args, mode, k)
            print(f"[cluster]   admitted {t['admitted']} of {t['cap_calls']} (+{t['topped_up_after_idle']} after idle), "
                  f"p50 {t['latency_us'].get('p50')} us, p99 {t['latency_us'].get('p99')} us, "
                  f"{t['lease_grants']} grants ({t['lease_grants_per_1k_admitted']} per 1k), over cap "
                  f"{t['over_cap_usd']} USD", flush=True)
            trials.append(t)
            st.check_alive()
    summary = {}
    for mode in ("lone", "cluster", "spread"):
        mine = [t for t in trials if t["mode"] == mode]
        if not mine:
            continue
        bins: dict[str, list[int]] = {}
        for t in mine:
            for b in t["grants_by_calls_left"]:
                acc = bins.setdefault(b["left_calls"], [0, 0])
                acc[0] += b["grants"]
                acc[1] += b["calls"]
        summary[mode] = {
            "trials": len(mine), "admitted": [t["admitted"] for t in mine], "cap_calls": args.near_calls,
            "filled_exactly": all(t["filled_exactly"] for t in mine),
            "max_over_cap_usd": str(max(Decimal(t["over_cap_usd"]) for t in mine)),
            "p50_us": _mean([t["latency_us"].get("p50") for t in mine]),
            "p99_us": _mean([t["latency_us"].get("p99") for t in mine]),
            "lease_grants_per_1k_admitted": _mean([t["lease_grants_per_1k_admitted"] for t in mine]),
            "grants_per_1k_by_calls_left": {k: round(1000 * g / n, 1) if n else None for k, (g, n) in bins.items()},
            "with_grant_p50_us": _mean([t["latency_with_grant_us"].get("p50") for t in mine]),
            "without_grant_p50_us": _mean([t["latency_without_grant_us"].get("p50") for t in mine]),
            "topped_up_after_idle": [t["topped_up_after_idle"] for t in mine],
            "admitted_before_first_refusal": [t["admitted_before_first_refusal"] for t in mine],
            "worker_cpu_us_per_call": _mean([t["worker_cpu_us_per_call"] for t in mine]),
            "calls_per_s": _mean([t["calls_per_s_first_pass"] for t in mine]),
            "first_slice_calls": args.near_calls // (2 * (len(INSTANCES) if mode != "lone" else 1)),
            "statements_per_1k_calls": _mean([1000 * sum(t["statements"]["statements"].values()) / t["calls"]
                                              for t in mine if t["calls"]]),
        }
    return {"cap_calls": args.near_calls, "call_usd": str(CALL_USD), "repeats": args.near_repeats,
            "top_up_idle_s": TOP_UP_IDLE_S, "trials": trials, "summary": summary}


# ---------------------------------------------------------------------------------------- return


def return_trial(st: ClusterStack, args, k: int) -> dict:
    tag = f"return-{k}-{secrets.token_hex(3)}"
    user = new_near_user(st, "cluster-a", args.return_calls, tag)
    for gw in ("cluster-b", "cluster-a"):
        _wait_serves(st, gw, user["key"], NEAR_MODEL, user["cap"])
    db = st.dbs["pg-cluster"]
    before = {bytes(r["resource"]) for r in db.query("SELECT resource FROM allowances")}
    b = st.gateways["cluster-b"]
    target = _near_target(st, "cluster-b", user["key"])
    conn = loadgen.Conn(target.host, target.port)
    try:
        for _ in range(args.return_used):
            _, sample, tail = conn.exchange(target)
            if sample.status != 200:
                raise BenchError(f"return trial: a call through cluster-b answered {sample.status}: {tail[:200]!r}")
    finally:
        conn.close()
    t_last = time.time()
    mono_last = time.monotonic()
    spent_nano = int(args.return_used * CALL_USD * NANO)
    rest_calls = args.return_calls - args.return_used
    new = [bytes(r["resource"]) for r in db.query("SELECT resource FROM allowances")
           if bytes(r["resource"]) not in before]
    if len(new) != 1:
        raise BenchError(f"return trial: expected one new allowance after the calls through cluster-b, saw {len(new)}")
    resource = new[0]
    probe = _near_target(st, "cluster-a", user["key"], max_tokens=rest_calls * NEAR_MAX_TOKENS)
    probe_conn = loadgen.Conn(probe.host, probe.port)
    sql = ("SELECT a.used, l.amount, l.declared FROM allowances a LEFT JOIN leases l "
           "ON l.resource = a.resource AND l.instance_id = $2::uuid WHERE a.resource = $1")
    samples: list[list] = []
    db_back_s = probe_ok_s = None
    probes = 0
    next_probe = time.monotonic()
    try:
        while time.monotonic() - mono_last < RETURN_TIMEOUT_S and (db_back_s is None or probe_ok_s is None):
            now = time.monotonic()
            if db_back_s is None:
                row = db.query(sql, resource, b.instance_id)[0]
                sample = [round(now - mono_last, 3), int(row["used"]), row["amount"], row["declared"]]
                if not samples or sample[1:] != samples[-1][1:]:
                    samples.append(sample)
                # b's slice holds only what b spent: its unused part is back in the allowance (a's own
                # grant, once the probe passes, changes `used` but not b's row).
                if row["amount"] is not None and int(row["amount"]) == spent_nano:
                    db_back_s = round(now - mono_last, 3)
            if probe_ok_s is None and now >= next_probe:
                next_probe = now + 0.1
                probes += 1
                _, s, tail = probe_conn.exchange(probe)
                if s.status == 200:
                    probe_ok_s = round(time.monotonic() - mono_last, 3)
                elif s.status != 429:
                    raise BenchError(f"return trial: the probe through cluster-a answered {s.status}: {tail[:200]!r}")
            time.sleep(0.05)
    finally:
        probe_conn.close()
    return {"repeat": k, "cap_calls": args.return_calls, "used_calls_on_b": args.return_used,
            "t_last_call": t_last, "allowance_back_s": db_back_s, "usable_from_a_s": probe_ok_s, "probes": probes,
            "probe_need_usd": str(rest_calls * CALL_USD),
            "allowance_timeline": [{"t_s": s[0], "used_nano_usd": s[1], "b_amount_nano_usd": s[2],
                                    "b_declared_nano_usd": s[3]} for s in samples]}


def phase_return(args, st: ClusterStack) -> dict:
    trials = []
    for k in range(args.return_repeats):
        print(f"[cluster] lease return #{k}: {args.return_used} calls through cluster-b, then idle ...", flush=True)
        t = return_trial(st, args, k)
        print(f"[cluster]   allowance back after {t['allowance_back_s']} s; usable from cluster-a after "
              f"{t['usable_from_a_s']} s", flush=True)
        trials.append(t)
        st.check_alive()
    back = [t["allowance_back_s"] for t in trials if t["allowance_back_s"] is not None]
    usable = [t["usable_from_a_s"] for t in trials if t["usable_from_a_s"] is not None]
    return {"trials": trials, "idle_beats": 4, "heartbeat_s": 1.0, "expected_s": EXPECTED_RETURN_S,
            "goal_s": GOAL_RETURN_S,
            "summary": {"allowance_back_s": {"min": min(back, default=None), "median": statistics.median(back)
                                             if back else None, "max": max(back, default=None)},
                        "usable_from_a_s": {"min": min(usable, default=None), "median": statistics.median(usable)
                                            if usable else None, "max": max(usable, default=None)},
                        "all_returned": len(usable) == len(trials),
                        "within_goal": bool(usable) and len(usable) == len(trials) and max(usable) <= GOAL_RETURN_S}}


# -------------------------------------------------------------------------------------- report


def summary_of(doc: dict) -> dict:
    far = doc.get("far") or {}
    rows: dict[str, dict] = {}
    for name in ("direct", "lone", "cluster"):
        rep = (far.get("targets") or {}).get(name)
        row: dict = {}
        if rep:
            row.update({"p50_us": rep["total_us"].get("p50"), "p99_us": rep["total_us"].get("p99"),
                        "added_p50_us": rep.get("added_us", {}).get("p50"),
                        "added_p99_us": rep.get("added_us", {}).get("p99"),
                        "round_p50_us": far["round_p50_us"].get(name)})
        thr = (far.get("throughput") or {}).get(f"{name}_summary")
        if thr:
            row.update({"rps": thr["requests_per_s"], "worker_cpu_us_per_call": thr["worker_cpu_us_per_call"],
                        "contender_cpu_us_per_call": thr["contender_cpu_us_per_call"]})
        if name != "direct":
            s1 = (far.get("statements") or {}).get(name) or {}
            s2 = ((far.get("throughput") or {}).get("statements") or {}).get(name) or {}
            resume = (far.get("resume") or {}).get(name) or {}
            r1 = resume.get("statements") or {}
            r2 = ((far.get("throughput") or {}).get("resume_statements") or {}).get(name) or {}
            calls = s1.get("calls", 0) + s2.get("calls", 0)
            grants = s1.get("lease_grants", 0) + s2.get("lease_grants", 0)
            coord = sum((s.get("above_idle") or {}).get(c, 0) for s in (s1, s2) for c in ("lease_grant", "cluster"))
            allc = sum(v for s in (s1, s2) for v in (s.get("above_idle") or {}).values())
            rcalls = r1.get("calls", 0) + r2.get("calls", 0)
            rgrants = r1.get("lease_grants", 0) + r2.get("lease_grants", 0)
            row.update({"far_calls": calls, "lease_grant_statements": grants,
                        "lease_grant_statements_per_1k": round(1000 * grants / calls, 3) if calls else None,
                        "coordination_statements_above_idle_per_1k": round(1000 * coord / calls, 3) if calls else None,
                        "all_statements_above_idle_per_1k": round(1000 * allc / calls, 3) if calls else None,
                        "b2b_lease_grant_statements": s1.get("lease_grants", 0),
                        "wrk_lease_grant_statements": s2.get("lease_grants", 0),
                        "wrk_grant_executions_by_offset_s": s2.get("grant_executions_by_offset_s"),
                        "wrk_max_beat_gap_s": (s2.get("max_beat_gap_s") or {}),
                        "steady_grant_bursts": [{k: b[k] for k in ("grants", "first_grant_s", "last_grant_s")}
                                                for b in (s1.get("grant_bursts") or []) + (s2.get("grant_bursts") or [])],
                        "resume_calls": rcalls, "resume_lease_grant_statements": rgrants,
                        "resume_lease_grant_statements_per_1k": round(1000 * rgrants / rcalls, 1) if rcalls else None,
                        "resume_grant_executions_by_offset_s": r1.get("grant_executions_by_offset_s"),
                        "resume_first_second_p50_us": (resume.get("first_second_us") or {}).get("p50"),
                        "resume_first_second_p99_us": (resume.get("first_second_us") or {}).get("p99"),
                        "resume_after_p50_us": (resume.get("after_us") or {}).get("p50")})
        rows[name] = row
    out: dict = {"far": rows}
    lone, clus = rows.get("lone", {}), rows.get("cluster", {})
    if lone.get("p50_us") is not None and clus.get("p50_us") is not None:
        delta = {k: round(clus[k] - lone[k], 1) for k in ("p50_us", "p99_us", "rps", "worker_cpu_us_per_call",
                                                          "contender_cpu_us_per_call")
                 if clus.get(k) is not None and lone.get(k) is not None}
        out["cluster_minus_lone"] = delta
        paired = far.get("paired_p50_cluster_minus_lone") or {}
        out["paired_p50_us"] = paired
        ci = paired.get("ci95_us")
        # Equal within noise: the per-round differences' 95% interval holds 0.
        out["p50_equal_within_noise"] = (ci[0] <= 0 <= ci[1]) if ci else None
        thr = far.get("throughput") or {}
        lr, cr = (thr.get("lone_summary") or {}), (thr.get("cluster_summary") or {})
        rps = zip(lr.get("requests_per_s_rounds") or [], cr.get("requests_per_s_rounds") or [], strict=False)
        cpu = zip(lr.get("worker_cpu_us_per_call_rounds") or [], cr.get("worker_cpu_us_per_call_rounds") or [],
                  strict=False)
        out["wrk_paired"] = {
            "rps_cluster_over_lone_rounds": [round(b / a, 3) for a, b in rps if a],
            "worker_cpu_cluster_minus_lone_rounds": [round(b - a, 1) for a, b in cpu if a is not None and b is not None]}
    idle = doc.get("idle") or {}
    if idle:
        out["idle"] = {"lone_statements_per_s": idle.get("pg-lone_statements_per_s"),
                       "cluster_statements_per_s": idle.get("pg-cluster_statements_per_s"),
                       "per_instance_per_s": {r: round(sum(c.values()), 2) for r, c in
                                              (idle.get("per_second") or {}).get("pg-cluster", {}).items()},
                       "cluster_by_category_per_s": (idle.get("rate_by_db") or {}).get("pg-cluster"),
                       "lone_by_category_per_s": (idle.get("rate_by_db") or {}).get("pg-lone"),
                       "cpu_pct": idle.get("cpu_pct")}
    near = (doc.get("near") or {}).get("summary")
    if near:
        out["near"] = near
    ret = (doc.get("return") or {}).get("summary")
    if ret:
        out["return"] = ret
    return out


def problems_of(doc: dict) -> list[str]:
    problems = []
    far = doc.get("far") or {}
    for name, rep in (far.get("targets") or {}).items():
        if rep.get("error_count"):
            problems.append(f"far {name}: {rep['error_count']} errors, e.g. {rep['errors'][:2]}")
    for name in ("lone", "cluster"):
        errors = ((far.get("resume") or {}).get(name) or {}).get("errors")
        if errors:
            problems.append(f"far resume {name}: errors, e.g. {errors[:2]}")
    for c, rs in ((far.get("throughput") or {}).get("runs") or {}).items():
        for r in rs:
            if r.get("errors_total"):
                problems.append(f"wrk {c}: {r['errors_total']} errors {r['wrk']['errors']}")
    for t in (doc.get("near") or {}).get("trials", []):
        for p in t["problems"]:
            problems.append(f"near {t['mode']} #{t['repeat']}: {p}")
        if Decimal(t["over_cap_usd"]) > 0:
            problems.append(f"near {t['mode']} #{t['repeat']}: OVERSHOOT {t['over_cap_usd']} USD")
        if t["admitted"] != t["cap_calls"]:
            problems.append(f"near {t['mode']} #{t['repeat']}: admitted {t['admitted']} calls, the cap fits "
                            f"{t['cap_calls']}")
    for t in (doc.get("return") or {}).get("trials", []):
        if t["usable_from_a_s"] is None:
            problems.append(f"return #{t['repeat']}: the rest of the cap was not usable from cluster-a within "
                            f"{RETURN_TIMEOUT_S} s")
    return problems


_f = harness.format_number


def print_tables(doc: dict) -> None:
    s = doc.get("summary") or {}
    far = s.get("far") or {}
    if far:
        print(f"\nFar from any cap, non-streamed chat completion; us; 1 conn back to back (added = - direct); "
              f"wrk -c{doc['config']['connections']}; DB statements per 1,000 calls (lease grants; coordination "
              f"above idle):")
        print(f"{'target':<9}{'p50':>7}{'+p50':>7}{'p99':>7}{'+p99':>7}{'req/s':>8}{'wkr cpu':>9}{'all cpu':>9}"
              f"{'grants/1k':>11}{'coord/1k':>10}{'resume grants/1k':>18}")
        for name, r in far.items():
            print(f"{name:<9}{_f(r.get('p50_us')):>7}{_f(r.get('added_p50_us')):>7}{_f(r.get('p99_us')):>7}"
                  f"{_f(r.get('added_p99_us')):>7}{_f(r.get('rps')):>8}{_f(r.get('worker_cpu_us_per_call')):>9}"
                  f"{_f(r.get('contender_cpu_us_per_call')):>9}{_f(r.get('lease_grant_statements_per_1k'), 2):>11}"
                  f"{_f(r.get('coordination_statements_above_idle_per_1k'), 2):>10}"
                  f"{_f(r.get('resume_lease_grant_statements_per_1k')):>18}")
        if s.get("cluster_minus_lone"):
            print(f"cluster - lone: {s['cluster_minus_lone']}; per-round p50 differences {s.get('paired_p50_us')} "
                  f"-> p50 equal within noise: {s.get('p50_equal_within_noise')}; wrk rounds {s.get('wrk_paired')}")
        c = far.get("cluster") or {}
        print(f"resume after {doc['config']['resume_idle_s']:g} s idle: cluster p50 {_f(c.get('resume_first_second_p50_us'))} "
              f"us in the first second, {_f(c.get('resume_after_p50_us'))} us after; grants by offset "
              f"{c.get('resume_grant_executions_by_offset_s')}; wrk steady grants by offset "
              f"{c.get('wrk_grant_executions_by_offset_s')}, longest beat gap {c.get('wrk_max_beat_gap_s')}")
    idle = s.get("idle")
    if idle:
        print(f"\nIdle: lone {idle['lone_statements_per_s']} statements/s, cluster {idle['cluster_statements_per_s']}/s "
              f"(per instance {idle['per_instance_per_s']}); cluster by category {idle['cluster_by_category_per_s']}; "
              f"CPU % {idle['cpu_pct']}")
    near = s.get("near")
    if near:
        print(f"\nNear a cap of {doc['near']['cap_calls']} calls, one connection until refused; grants per 1,000 "
              f"admitted calls by calls' worth left:")
        print(f"{'mode':<9}{'admitted(+idle)':>18}{'p50':>7}{'p99':>7}{'grants/1k':>11}  {'by calls left':<44}"
              f"{'p50 w/ grant':>13}{'w/o':>7}")
        for mode, r in near.items():
            adm = "/".join(f"{a}+{t}" if t else str(a) for a, t in zip(r["admitted_before_first_refusal"],
                                                                        r["topped_up_after_idle"], strict=True))
            print(f"{mode:<9}{adm:>18}{_f(r['p50_us']):>7}{_f(r['p99_us']):>7}"
                  f"{_f(r['lease_grants_per_1k_admitted'], 2):>11}  {str(r['grants_per_1k_by_calls_left']):<44}"
                  f"{_f(r['with_grant_p50_us']):>13}{_f(r['without_grant_p50_us']):>7}")
    ret = s.get("return")
    if ret:
        print(f"\nLease return (idle slice on cluster-b): allowance back {ret['allowance_back_s']} s; the rest of the "
              f"cap usable from cluster-a {ret['usable_from_a_s']} s (goal {GOAL_RETURN_S:g} s)")


# ------------------------------------------------------------------------------------------ main


def working_tree() -> dict:
    """What ran besides the commit: the extension's digest and the files that differ from it."""
    so = sorted((ROOT / "meshfast").glob("_core*.so"))
    out: dict = {}
    if so:
        out["core_so"] = {"path": str(so[0].relative_to(ROOT)), "sha256": hashlib.sha256(so[0].read_bytes()).hexdigest(),
                          "mtime": dt.datetime.fromtimestamp(so[0].stat().st_mtime, dt.UTC).isoformat()}
    rc, status = harness.cmd_output(["git", "status", "--porcelain", "--", ".", ":!bench/results", ":!paper"])
    out["dirty_files"] = status.splitlines() if rc == 0 else None
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=2, help="Granian workers of lone and cluster-a")
    p.add_argument("--idle-workers", type=int, default=1, help="Granian workers of cluster-b and cluster-c")
    p.add_argument("--upstream-workers", type=int, default=1, help="nginx worker processes")
    p.add_argument("--idle-s", type=float, default=10.0, help="seconds without calls (heartbeats, idle CPU)")
    p.add_argument("--warmup-s", type=float, default=2.0, help="back-to-back warm-up per target before the far phase")
    p.add_argument("--b2b-rounds", type=int, default=20, help="back-to-back rounds (targets take turns)")
    p.add_argument("--b2b-duration", type=float, default=1.0, help="measured back-to-back seconds per target per round")
    p.add_argument("--resume-idle-s", type=float, default=6.0, help="seconds without calls before a resume trial")
    p.add_argument("--resume-s", type=float, default=3.0, help="back-to-back seconds per contender after the pause")
    p.add_argument("--resume-trials", type=int, default=3, help="resume trials")
    p.add_argument("--connections", type=int, default=64, help="wrk connections")
    p.add_argument("--threads", type=int, default=1, help="wrk threads")
    p.add_argument("--wrk-duration", type=int, default=10, help="measured wrk seconds per run")
    p.add_argument("--wrk-warmup", type=int, default=4, help="wrk seconds before each, kept apart (the ramp)")
    p.add_argument("--wrk-rounds", type=int, default=3, help="wrk rounds (the contenders' order alternates)")
    p.add_argument("--near-calls", type=int, default=3000, help="calls the near-cap trials' daily cap fits")
    p.add_argument("--near-repeats", type=int, default=2, help="times each near-cap trial runs")
    p.add_argument("--return-calls", type=int, default=100, help="calls the lease-return trials' cap fits")
    p.add_argument("--return-used", type=int, default=5, help="calls made through cluster-b before it goes idle")
    p.add_argument("--return-repeats", type=int, default=3, help="lease-return trials")
    p.add_argument("--skip", action="append", default=[], choices=PHASES, help="leave a phase out (repeatable)")
    p.add_argument("--quick", action="store_true",
                   help="smoke check (~1.5 min): 3 s idle, 4 x 1 s back to back, one resume, wrk 3 + 3 s once, a cap "
                        "of 500 calls once, one lease return")
    p.add_argument("--meshfast-cmd", default=harness.default_meshfast_cmd(fallback=False),
                   help="command that takes `serve ...` (meshfast is imported from the working tree)")
    p.add_argument("--out", type=Path, help="result JSON (default bench/results/cluster-<timestamp>.json)")
    args = p.parse_args(argv)
    if args.quick:
        args.idle_s, args.warmup_s, args.b2b_rounds, args.b2b_duration = 3.0, 1.0, 4, 1.0
        args.resume_trials, args.resume_s = 1, 2.0
        args.wrk_duration, args.wrk_warmup, args.wrk_rounds = 3, 3, 1
        args.near_calls, args.near_repeats, args.return_repeats = 500, 1, 1
    args.only = None  # models_bench.provenance() reads it
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    missing = [f"{tool} missing: apt-get install -y {tool}" for tool in ("wrk", "nginx") if not shutil.which(tool)]
    if missing:
        print("[cluster] " + "\n[cluster] ".join(missing), file=sys.stderr)
        return 2
    started = dt.datetime.now(dt.UTC)
    out_path = args.out or RESULTS_DIR / f"cluster-{started.strftime('%Y%m%dT%H%M%SZ')}{'-quick' if args.quick else ''}.json"
    # The gateways import meshfast from the working tree (and so does the provenance probe).
    os.environ.update({k: v for k, v in fb.server_env(argparse.Namespace(loop=None)).items()
                       if k in ("PYTHONPATH", "PYTHONSAFEPATH")})
    prov = fb.provenance(argparse.Namespace(**{**vars(args), "loop": None, "forwarder_rs": fb.FORWARDER_RS}))
    prov.pop("forwarder_rs", None)
    prov["working_tree"] = working_tree()
    doc: dict = {
        "benchmark": "cluster",
        "description": ("scale-out: one lone instance vs one instance of a 3-instance cluster on one PostgreSQL, side by "
                        "side on nginx: added latency and CPU far from any cap, near a cap (slices shrink), database "
                        "round trips per 1,000 calls, heartbeat statements, the time an unused lease takes to return"),
        **harness.run_header(argv, started, prov),
        "config": {**{k: v for k, v in vars(args).items() if k not in ("out", "only")},
                   "runtime": {"loop": "auto (Granian default)", "task_impl": "asyncio (Granian default)",
                               "runtime_mode": "auto (Granian default)"},
                   "contenders": {"lone": f"1 instance, {args.workers} workers, its own PostgreSQL",
                                  "cluster": f"3 instances on one PostgreSQL: cluster-a {args.workers} workers (measured), "
                                             f"cluster-b and cluster-c {args.idle_workers} worker(s) each, idle"},
                   "far_policy": fb.POLICY, "near_call_usd": str(CALL_USD), "near_max_tokens": NEAR_MAX_TOKENS,
                   "round_trip_counting": ("PostgreSQL's statement log (log_statement = all on both servers; pgserver's "
                                           "PostgreSQL 16 has no pg_stat_statements); lease grants cross-checked with "
                                           "pg_stat_user_functions (track_functions = pl)"),
                   "upstream_body": fb.SSE_STREAM.decode()},
        "note": NOTE,
        "background_cpu_busy_pct": harness.cpu_busy_pct(),
    }
    failures: list[str] = []
    stack: ClusterStack | None = None

    def run(name: str, fn) -> None:
        if name in args.skip:
            doc[name] = None
            return
        print(f"[cluster] {name} ...", flush=True)
        t0 = time.monotonic()
        try:
            doc[name] = fn()
            doc[name]["phase_s"] = round(time.monotonic() - t0, 1)
        except (BenchError, loadgen.LoadgenError, OSError, subprocess.SubprocessError, KeyError, ValueError) as exc:
            failures.append(f"{name}: {exc}")
            doc[name] = {"error": str(exc)[:3000]}
            print(f"[cluster] {name} FAILED: {exc}", file=sys.stderr)

    with tempfile.TemporaryDirectory(prefix="meshfast-cluster-bench-") as work:
        work_dir = Path(work)
        try:
            print("[cluster] starting nginx, two PostgreSQL servers, lone and a 3-instance cluster ...", flush=True)
            stack = start_stack(args, work_dir)
            doc["servers"] = {s.name: shlex.join(harness.redact(s.argv, stack.secrets())) for s in stack.servers()}
            doc["worker_pids"] = {g.name: fb.worker_pids(g.server) for g in stack.gateways.values()}
            doc["setup"] = stack.setup
            run("idle", lambda: phase_idle(args, stack))
            idle = doc.get("idle") if isinstance(doc.get("idle"), dict) and "rate_by_db" in doc["idle"] else None
            run("far", lambda: phase_far(args, stack, idle, work_dir))
            run("near", lambda: phase_near(args, stack))
            run("return", lambda: phase_return(args, stack))
            # pg_stat_user_functions: each backend reports at most every 10 s while idle.
            time.sleep(11.0)
            doc["grant_cross_check"] = {}
            for name, db in stack.dbs.items():
                logged = db.log.between(0, time.time() + 60)
                grants = sum(1 for s in logged if s.category == "lease_grant" and "meshfast_lease_grant" in s.head)
                # With the pool's reset after each: the round trips one grant costs a call.
                with_resets = sum(1 for s in logged if s.category == "lease_grant")
                doc["grant_cross_check"][name] = {
                    "pg_stat_user_functions_calls": db.grant_calls(), "log_statements": grants,
                    "lease_grant_category_statements": with_resets,
                    "statements_per_grant": round(with_resets / grants, 3) if grants else None}
            doc["statements_logged"] = {name: len(db.log.statements) for name, db in stack.dbs.items()}
            doc["statement_samples"] = {name: sorted({(s.category, s.head[:120]) for s in db.log.statements})[:80]
                                        for name, db in stack.dbs.items()}
        except BenchError as exc:
            failures.append(str(exc))
            print(f"[cluster] FAILED: {exc}", file=sys.stderr)
        except (KeyboardInterrupt, subprocess.TimeoutExpired) as exc:
            failures.append(f"interrupted: {exc!r}")
        finally:
            if stack is not None:
                stack.stop_into(doc)
            if _RUNNER is not None:
                _RUNNER.close()
    doc["loadavg_end"] = list(os.getloadavg())
    busy = doc.get("background_cpu_busy_pct")
    doc["quiet_machine"] = busy is not None and busy < harness.BUSY_WARN_PCT
    check = doc.get("grant_cross_check") or {}
    for name, c in check.items():
        if c["pg_stat_user_functions_calls"] != c["log_statements"]:
            failures.append(f"{name}: the log counts {c['log_statements']} lease grants, pg_stat_user_functions "
                            f"{c['pg_stat_user_functions_calls']}")
    failures += problems_of(doc)
    doc["summary"] = summary_of(doc)
    return harness.finish(doc, failures, started, out_path, "cluster", print_tables, indent=1)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    sys.exit(main())
