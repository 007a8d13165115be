"""``meshfast serve --demo``: testserve-backed providers, models and a user, ready to call.

The supervisor starts testserve (the emulated providers shipped in the wheel) beside the
gateway and seeds, once, one provider per family with its chat and scenario models, and a demo
user granted all of them. The demo key is kept in the data dir (0600) so every start can print it.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from meshfast import errors
from meshfast.admin import service as svc
from meshfast.secrets import Secrets
from meshfast.store import database

DEMO_EMAIL = "demo@meshfast.local"


class Testserve:
    """testserve in a child process, on loopback."""

    def __init__(self, port: int) -> None:
        self.port = port
        self._proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Testserve:
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "testserve", "--host", "127.0.0.1", "--port", str(self.port)],
            stdin=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise SystemExit(f"meshfast: testserve exited with {self._proc.returncode}")
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=1):
                    return self
            time.sleep(0.1)
        raise SystemExit("meshfast: testserve did not start")

    def __exit__(self, *exc: object) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()


async def seed(url: str, secrets: Secrets, data_dir: Path, testserve_port: int) -> str:
    """Create what is missing of the demo; returns the demo user's key."""
    from testserve.seed import demo_providers

    async def no_rebuild(_seq: int, _change: str) -> None:
        return None

    pool = await database.create_pool(url, role=database.ADMIN_ROLE, min_size=1, max_size=2)
    service = svc.AdminService(pool, secrets, no_rebuild)
    key_file = data_dir / "demo-key"
    try:
        existing = {p["name"] for p in await service.list_providers()}
        for body in demo_providers(testserve_port):
            if body["name"] not in existing:
                import msgspec

                await service.create_provider("demo", msgspec.convert(body, svc.ProviderCreate))
        users = {u["email"]: u for u in await service.list_users()}
        if DEMO_EMAIL in users and key_file.exists():
            user_id = users[DEMO_EMAIL]["id"]
            key = key_file.read_text().strip()
        elif DEMO_EMAIL in users:
            user_id = users[DEMO_EMAIL]["id"]
            key = (await service.rotate_key("demo", user_id))["key"]
        else:
            created: dict[str, Any] = await service.create_user(
                "demo", svc.UserCreate(email=DEMO_EMAIL, display_name="Demo"))
            user_id, key = created["id"], created["key"]
        fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(key + "\n")
        for model in await service.list_models():
            if model["provider_name"].startswith("testserve-"):
                with contextlib.suppress(errors.MeshfastError):
                    await service.grant("demo", svc.AccessBody(user_id=user_id, model_id=model["id"]))
        return key
    finally:
        await pool.close()
