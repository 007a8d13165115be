"""Start-up, restart and isolation: data dir secrets, keys surviving restarts, RLS, side by side."""

from __future__ import annotations

import asyncio
import dataclasses
import stat
import subprocess
import sys
from pathlib import Path

import asyncpg
import pytest
from conftest import Gateway

from meshfast.settings import Settings
from meshfast.store import database


def _bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def test_keys_survive_a_restart_and_secrets_are_private(fresh_dir: Path) -> None:
    """A key issued before a restart still works after it; secrets.json is mode 0600."""
    data_dir = fresh_dir / "data"
    gw = Gateway(data_dir, workers=2).start()
    try:
        provider = gw.create_provider("p-restart")
        model = gw.create_model(provider["id"], "restart-model")
        user = gw.create_user()
        gw.grant(user["id"], model["id"])
        assert gw.client.get("/v1/models", headers=_bearer(user["key"])).status_code == 200
    finally:
        gw.stop()
    # The supervisor stopped the embedded PostgreSQL and removed its shared-memory segment.
    assert not (data_dir / "pg" / "postmaster.pid").exists()
    settings = dataclasses.replace(Settings.from_env(), data_dir=data_dir.resolve())
    assert not settings.shm_path.exists()
    secrets_file = data_dir / "secrets.json"
    assert stat.S_IMODE(secrets_file.stat().st_mode) == 0o600
    before = secrets_file.read_bytes()

    again = Gateway(data_dir, workers=2, admin_token=gw.admin_token).start()
    try:
        response = again.client.get("/v1/models", headers=_bearer(user["key"]))
        assert response.status_code == 200
        assert [m["id"] for m in response.json()["data"]] == ["restart-model"]
        assert secrets_file.read_bytes() == before
    finally:
        again.stop()


def test_admin_token_env_is_honoured_on_every_start(fresh_dir: Path) -> None:
    """Changing MESHFAST_ADMIN_TOKEN between starts replaces the bootstrap token."""
    data_dir = fresh_dir / "data"
    first = Gateway(data_dir, workers=1, admin_token="first-token").start()
    try:
        assert first.admin("GET", "/admin/users").status_code == 200
    finally:
        first.stop()
    second = Gateway(data_dir, workers=1, admin_token="second-token").start()
    try:
        assert second.admin("GET", "/admin/users").status_code == 200
        assert second.admin("GET", "/admin/users", token="first-token").status_code == 401
    finally:
        second.stop()


def test_generated_admin_token_is_printed_once(fresh_dir: Path) -> None:
    """Without MESHFAST_ADMIN_TOKEN a token is generated, printed on first start only, and works."""
    data_dir = fresh_dir / "data"
    gw = Gateway(data_dir, workers=1)
    gw.admin_token = ""
    env_token = gw.env
    gw.env = lambda: {k: v for k, v in env_token().items() if k != "MESHFAST_ADMIN_TOKEN"}  # type: ignore[method-assign]
    gw.start()
    try:
        printed = [line for line in gw.log().splitlines() if "admin token" in line]
        assert len(printed) == 1
        token = printed[0].rsplit(" ", 1)[1]
        assert gw.admin("GET", "/admin/users", token=token).status_code == 200
    finally:
        gw.stop()
    gw.start()
    try:
        assert len([line for line in gw.log().splitlines() if "admin token" in line]) == 1
    finally:
        gw.stop()


def test_two_instances_run_side_by_side(fresh_dir: Path) -> None:
    """Different data dirs and ports: separate databases, segments and keys."""
    a = Gateway(fresh_dir / "a", workers=1).start()
    b = Gateway(fresh_dir / "b", workers=1).start()
    try:
        assert a.port != b.port and a.data_dir != b.data_dir
        user_a = a.create_user("same@example.com")
        user_b = b.create_user("same@example.com")
        for gw, key, status in ((a, user_a["key"], 200), (b, user_a["key"], 401), (b, user_b["key"], 200),
                                (a, user_b["key"], 401)):
            response = gw.client.get("/v1/models", headers=_bearer(key))
            assert response.status_code == status, (gw.port, response.text, gw.log())
    finally:
        a.stop()
        b.stop()


def test_gateway_role_cannot_change_configuration(fresh_dir: Path) -> None:
    """Row-level security: the gateway role reads configuration but cannot write it."""
    pg = database.EmbeddedPostgres(fresh_dir / "pg")
    url = pg.start()
    try:

        async def check() -> None:
            await database.migrate(url)
            admin = await database.connect(url, role=database.ADMIN_ROLE)
            gateway = await database.connect(url, role=database.GATEWAY_ROLE)
            try:
                user_id = await admin.fetchval(
                    "INSERT INTO users (email, display_name) VALUES ('rls@example.com', 'R') RETURNING id")
                assert await gateway.fetchval("SELECT count(*) FROM users") == 1
                for statement in (
                    "UPDATE users SET status = 'active'",
                    "DELETE FROM users",
                    "INSERT INTO users (email, display_name) VALUES ('x@example.com', 'X')",
                    "UPDATE gateway_state SET kill_switch = true",
                    "INSERT INTO admin_tokens (name, token_hash, created_by) VALUES ('x', 'y', 'z')",
                ):
                    with pytest.raises(asyncpg.InsufficientPrivilegeError):
                        await gateway.execute(statement)
                with pytest.raises(asyncpg.InsufficientPrivilegeError):
                    await gateway.fetch("SELECT * FROM admin_tokens")
                with pytest.raises(asyncpg.InsufficientPrivilegeError):
                    await gateway.fetch("SELECT * FROM request_logs")
                # What the gateway may do: append logs and write counters.
                await gateway.execute(
                    "INSERT INTO request_logs (id, request_id, created_at, outcome, status_code) "
                    "VALUES (gen_random_uuid(), 'req_x', now(), 'denied', 401)")
                await gateway.execute(
                    "INSERT INTO daily_spend (user_id, model_id, day, spend_nano_usd) "
                    "SELECT $1, m.id, current_date, 1 FROM models m", user_id)
                # And the admin cannot rewrite history.
                with pytest.raises(asyncpg.InsufficientPrivilegeError):
                    await admin.execute("UPDATE request_logs SET status_code = 200")
                with pytest.raises(asyncpg.InsufficientPrivilegeError):
                    await admin.execute("UPDATE admin_audit_log SET action = 'x'")
                row_security = await admin.fetch(
                    "SELECT relname FROM pg_class WHERE relkind IN ('r', 'p') AND relnamespace = 'public'::regnamespace"
                    " AND relname NOT IN ('meshfast_migrations', 'request_logs_ingest')"
                    " AND NOT (relrowsecurity AND relforcerowsecurity)")
                assert row_security == []
                # The ingest table (COPY's entry point) holds nothing and the gateway may only insert.
                await gateway.execute(
                    "INSERT INTO request_logs_ingest (id, request_id, created_at, outcome, status_code) "
                    "VALUES (gen_random_uuid(), 'req_y', now(), 'denied', 401)")
                with pytest.raises(asyncpg.InsufficientPrivilegeError):
                    await gateway.fetch("SELECT * FROM request_logs_ingest")
                assert await admin.fetchval("SELECT count(*) FROM request_logs WHERE request_id = 'req_y'") == 1
            finally:
                await admin.close()
                await gateway.close()

        asyncio.run(check())
    finally:
        pg.stop()


def test_migrate_command_is_idempotent(fresh_dir: Path) -> None:
    """`meshfast migrate` applies the shipped migrations once, then reports up to date."""
    env = {"MESHFAST_DATA_DIR": str(fresh_dir / "data"), "PATH": "/usr/bin:/bin", "PYTHONSAFEPATH": "1"}
    run = lambda: subprocess.run([sys.executable, "-m", "meshfast.cli", "migrate"], env=env,  # noqa: E731
                                 capture_output=True, text=True, timeout=120)
    first = run()
    assert first.returncode == 0, first.stderr
    assert "applied 0001_schema" in first.stdout
    second = run()
    assert second.returncode == 0 and "up to date" in second.stdout


def test_help_documents_every_command_and_variable() -> None:
    """`meshfast --help` lists the commands and every environment variable."""
    from meshfast.settings import ENV_DOC

    out = subprocess.run([sys.executable, "-m", "meshfast.cli", "--help"], capture_output=True, text=True).stdout
    for command in ("serve", "migrate", "users", "apply", "admins"):
        assert command in out
    for name, _ in ENV_DOC:
        assert name in out


def test_exactly_one_worker_leads_and_prepares_log_partitions(gateway: Gateway) -> None:
    """One advisory-lock leader among the workers; request_logs partitions exist a week ahead."""
    import datetime as dt
    import time

    from meshfast.leader import _LEADER_LOCK

    url = f"postgresql://postgres:@/postgres?host={gateway.data_dir / 'pg'}"

    async def check() -> tuple[int, set[str]]:
        conn = await asyncpg.connect(url)
        try:
            holders = await conn.fetchval(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"
                " AND classid = $1 AND objid = $2",
                _LEADER_LOCK >> 32, _LEADER_LOCK & 0xFFFFFFFF)
            names = {r["tablename"] for r in await conn.fetch(
                "SELECT tablename FROM pg_tables WHERE tablename LIKE 'request_logs_%'")}
            return holders, names
        finally:
            await conn.close()

    deadline = time.monotonic() + 10
    holders, names = asyncio.run(check())
    while holders != 1 and time.monotonic() < deadline:
        time.sleep(0.2)
        holders, names = asyncio.run(check())
    assert holders == 1
    today = dt.datetime.now(dt.UTC).date()
    for offset in range(8):
        assert f"request_logs_{(today + dt.timedelta(days=offset)):%Y%m%d}" in names


def test_spend_and_calls_survive_a_restart(fresh_dir: Path, testserve) -> None:  # type: ignore[no-untyped-def]
    """Spend and hourly calls are checkpointed to PostgreSQL and re-seeded on the next start."""
    data_dir = fresh_dir / "data"
    gw = Gateway(data_dir, workers=2).start()
    try:
        provider = gw.create_provider("p-spend", family="anthropic", base_url=f"{testserve.base_url}/anthropic",
                                      api_key="testserve-key")
        model = gw.create_model(provider["id"], "spend-model", resolved_model="dummy-chat")
        user = gw.create_user()
        gw.grant(user["id"], model["id"])
        for _ in range(3):
            response = gw.client.post("/v1/proxy", params={"model": "spend-model"}, json={"query": "hello"},
                                      headers=_bearer(user["key"]))
            assert response.status_code == 200
        usage = gw.client.get("/v1/usage", headers=_bearer(user["key"])).json()["usage"][0]
        models = gw.client.get("/v1/models", headers=_bearer(user["key"])).json()["models"][0]
        spent = usage["spent_usd"]
        assert spent > 0 and models["usage"]["calls_this_hour"] == 3
    finally:
        gw.stop()
    again = Gateway(data_dir, workers=2, admin_token=gw.admin_token).start()
    try:
        usage = again.client.get("/v1/usage", headers=_bearer(user["key"])).json()["usage"][0]
        models = again.client.get("/v1/models", headers=_bearer(user["key"])).json()["models"][0]
        assert usage["spent_usd"] == spent
        assert models["usage"]["calls_this_hour"] == 3
    finally:
        again.stop()


def test_a_dashboard_login_is_bootstrapped_from_the_cli(fresh_dir: Path) -> None:
    """`meshfast admins create` makes the first login; the dashboard's login route accepts it."""
    import os

    import httpx

    env = dict(os.environ, MESHFAST_DATA_DIR=str(fresh_dir / "data"), MESHFAST_ADMIN_PASSWORD="a long passphrase")
    made = subprocess.run([sys.executable, "-m", "meshfast.cli", "admins", "create", "--email", "Ops@Example.com",
                           "--super", "--json"], capture_output=True, text=True, env=env, timeout=120)
    assert made.returncode == 0, made.stderr
    assert "passphrase" not in made.stdout and '"is_super": true' in made.stdout
    gw = Gateway(fresh_dir / "data").start()
    try:
        r = httpx.post(f"{gw.base_url}/admin/login", json={"email": "ops@example.com", "password": "a long passphrase"})
        assert r.status_code == 200 and r.json()["csrf_token"]
    finally:
        gw.stop()
