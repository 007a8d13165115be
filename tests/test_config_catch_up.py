"""A write one worker made is never refused by another: a worker that has not loaded a write its
instance knows of waits for it before it refuses a key, a model or a grant."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from conftest import SESSION_ENV, EmulatedProviders, Gateway, WorkerConnections

# Every worker hears other workers' writes (their NOTIFY) 1.5 s late; its own writes apply at once.
LATE_NOTIFY = """
import os
if os.environ.get("MESHFAST_TEST_NOTIFY_DELAY_S"):
    import asyncio
    from meshfast import app as _app

    _delay = float(os.environ["MESHFAST_TEST_NOTIFY_DELAY_S"])
    _notified = _app.ConfigFeed._notified

    def _late(self, payload):
        asyncio.get_running_loop().call_later(_delay, _notified, self, payload)

    _app.ConfigFeed._notified = _late
"""


def _chat(model: str) -> bytes:
    return json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}]}).encode()


def test_a_new_key_and_grant_work_on_every_worker_at_once(fresh_dir: Path, testserve: EmulatedProviders) -> None:
    site = fresh_dir / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(LATE_NOTIFY)
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)
    gw = Gateway(fresh_dir / "data", workers=2,
                 env={**SESSION_ENV, "PYTHONPATH": path, "MESHFAST_TEST_NOTIFY_DELAY_S": "1.5"}).start()
    conns = WorkerConnections(gw)
    try:
        provider = gw.create_provider("catch-p", family="anthropic", base_url=f"{testserve.base_url}/anthropic",
                                      api_key="testserve-key")
        model = gw.create_model(provider["id"], "catch-model", resolved_model="dummy-chat")
        time.sleep(2.0)  # both workers have the model: what follows is one write behind on one of them
        user = gw.create_user()
        gw.grant(user["id"], model["id"])
        took: dict[int, float] = {}
        for pid in conns.by_pid:
            began = time.monotonic()
            status, body = conns.post(pid, "/v1/chat/completions", {"Authorization": f"Bearer {user['key']}"},
                                      _chat("catch-model"))
            took[pid] = time.monotonic() - began
            assert status == 200, (pid, body)
        # One worker made the grant and answered at once; the other was behind by the user and
        # the grant, and waited for them instead of refusing the new key.
        assert min(took.values()) < 1.0 and max(took.values()) >= 0.5, took

        # The read-only views wait the same way: a fresh key lists its models on every worker.
        other = gw.create_user()
        gw.grant(other["id"], model["id"])
        for pid in conns.by_pid:
            status, body = conns.get_all("/v1/models", {"Authorization": f"Bearer {other['key']}"})[pid]
            assert status == 200 and b"catch-model" in body, (pid, status, body)

        # Not behind: a wrong key is refused at once, without a wait, on every worker.
        time.sleep(2.0)
        for pid in conns.by_pid:
            began = time.monotonic()
            status, body = conns.post(pid, "/v1/chat/completions", {"Authorization": "Bearer mesh_live_" + "x" * 43},
                                      _chat("catch-model"))
            assert status == 401 and time.monotonic() - began < 0.5, (pid, status, body)
    finally:
        conns.close()
        gw.stop()
