"""Organisation and rule changes at scale: with half a million grants loaded (a full snapshot
rebuild then takes seconds), a manager change and a new rule still reach every worker within 1 s,
because a worker patches its snapshot instead of rebuilding it (``ConfigFeed``)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import asyncpg
from conftest import Gateway, WorkerConnections, running_gateway

BULK_USERS = 50_000
MODELS = 10


def _bulk_load(gw: Gateway, model_ids: list[str]) -> None:
    """50,000 people (business units and tiers, no keys) with every model granted: 500,000
    grants, written straight to the database (no NOTIFY: the next full rebuild picks them up)."""
    async def load() -> None:
        conn = await asyncpg.connect(gw.database_url)
        try:
            await conn.execute(f"""
                INSERT INTO users (email, display_name, business_unit, tier)
                SELECT 'bulk' || g || '@example.com', 'Bulk ' || g, 'bu' || (g % 50),
                       (ARRAY['normal', 'senior', 'exec'])[1 + g % 3]
                FROM generate_series(1, {BULK_USERS}) g""")
            await conn.execute("""
                INSERT INTO user_model_access (user_id, model_id)
                SELECT u.id, m FROM users u CROSS JOIN unnest($1::uuid[]) m WHERE u.email LIKE 'bulk%'""",
                               model_ids)
        finally:
            await conn.close()

    asyncio.run(load())


def _until(check: Any, timeout_s: float, what: str) -> float:
    started = time.monotonic()
    while True:
        if check():
            return time.monotonic() - started
        if time.monotonic() - started > timeout_s:
            raise AssertionError(f"{what}: not within {timeout_s} s")
        time.sleep(0.01)


def _rules_on_every_worker(workers: WorkerConnections, auth: dict[str, str]) -> list[set[str]]:
    return [{r["id"] for r in json.loads(body)["rules"]} if status == 200 else set()
            for status, body in workers.get_all("/v1/usage", auth).values()]


def test_a_reorg_and_a_new_rule_reach_every_worker_within_a_second_with_half_a_million_grants() -> None:
    with running_gateway(2) as gw:
        provider = gw.create_provider("scale-provider")
        models = [gw.create_model(provider["id"], f"scale-m{i}", tags=["opus"]) for i in range(MODELS)]
        caller, leader = gw.create_user(), gw.create_user()
        gw.grant(caller["id"], models[0]["id"])
        _bulk_load(gw, [m["id"] for m in models])

        # A full rebuild (a new user is not a patch) loads the half million grants on both workers.
        started = time.monotonic()
        probe = gw.create_user()
        probe_auth = {"authorization": f"Bearer {probe['key']}"}
        auth = {"authorization": f"Bearer {caller['key']}"}
        workers = WorkerConnections(gw)
        try:
            _until(lambda: all(s == 200 for s, _ in workers.get_all("/v1/models", probe_auth).values()),
                   60, "the full rebuild")
            full_rebuild_s = time.monotonic() - started

            rule = {"id": "scale-org", "weight": 1, "mode": "enforce", "entries": [{
                "population": {"leaders": [leader["id"]]}, "scope": {"tag": "opus"}, "window": "monthly",
                "threshold_usd": "1", "actions": [{"type": "block"}]}]}
            created = gw.admin("POST", "/admin/rules", rule)
            assert created.status_code == 201, created.text
            assert all("scale-org" not in rules for rules in _rules_on_every_worker(workers, auth))

            etag = gw.admin("GET", f"/admin/users/{caller['id']}").headers["etag"]
            started = time.monotonic()
            moved = gw.client.put(f"/admin/users/{caller['id']}", json={"manager_id": leader["id"]},
                                  headers={"authorization": f"Bearer {gw.admin_token}", "if-match": etag})
            assert moved.status_code == 200, moved.text
            reorg_s = _until(lambda: all("scale-org" in r for r in _rules_on_every_worker(workers, auth)),
                             1.0, "the reorg on every worker")
            reorg_s = time.monotonic() - started

            tiered = {**rule, "id": "scale-tier", "entries": [{**rule["entries"][0], "population": {}}]}
            started = time.monotonic()
            assert gw.admin("POST", "/admin/rules", tiered).status_code == 201
            _until(lambda: all("scale-tier" in r for r in _rules_on_every_worker(workers, auth)),
                   1.0, "the new rule on every worker")
            rule_s = time.monotonic() - started
        finally:
            workers.close()
        log = gw.log()
    assert "patched (user)" in log and "patched (rules)" in log, "the changes were patched, not rebuilt"
    print(f"full rebuild {full_rebuild_s:.2f} s; reorg {reorg_s * 1000:.0f} ms; new rule {rule_s * 1000:.0f} ms")
    assert full_rebuild_s > reorg_s
