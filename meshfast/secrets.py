"""First-run secrets: the master key (seals provider keys) and the key pepper.

Both live in ``secrets.json`` in the data dir, mode 0600, created atomically on first start.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

import msgspec

KEY_PREFIX = "mesh_live_"


class _SecretsFile(msgspec.Struct, forbid_unknown_fields=True):
    version: int
    master_key: str
    key_pepper: str


@dataclass(frozen=True, slots=True)
class Secrets:
    master_key: bytes
    key_pepper: bytes

    def hash_key(self, token: str) -> bytes:
        """SHA-256(pepper || token): what the key index stores and looks up."""
        return hashlib.sha256(self.key_pepper + token.encode()).digest()

    def hash_admin_token(self, token: str) -> str:
        return hmac.new(self.key_pepper, b"admin:" + token.encode(), hashlib.sha256).hexdigest()


def ensure_data_dir(data_dir: Path) -> None:
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)


def load_or_create(path: Path) -> Secrets:
    """Read the secrets file, creating it (0600, atomically) on first start."""
    if not path.exists():
        ensure_data_dir(path.parent)
        body = msgspec.json.encode(
            _SecretsFile(
                version=1,
                master_key=secrets.token_bytes(32).hex(),
                key_pepper=secrets.token_bytes(32).hex(),
            )
        )
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, body)
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            # NOTE: link, not rename, so a concurrent first start keeps the winner's secrets.
            os.link(tmp, path)
        except FileExistsError:
            pass
        finally:
            tmp.unlink(missing_ok=True)
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        os.chmod(path, 0o600)
    raw = msgspec.json.decode(path.read_bytes(), type=_SecretsFile)
    return Secrets(master_key=bytes.fromhex(raw.master_key), key_pepper=bytes.fromhex(raw.key_pepper))


def new_mesh_key() -> tuple[str, str]:
    """A fresh caller key and its display prefix (``mesh_live_`` + 6 chars + ``...``)."""
    body = base64.urlsafe_b64encode(secrets.token_bytes(32)).rstrip(b"=").decode()
    key = KEY_PREFIX + body
    return key, f"{KEY_PREFIX}{body[:6]}..."


def new_admin_token() -> str:
    return "mesh_admin_" + base64.urlsafe_b64encode(secrets.token_bytes(32)).rstrip(b"=").decode()
