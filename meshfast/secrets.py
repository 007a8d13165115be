"""First-run secrets: the master key (seals provider keys) and the key pepper.

Both live in ``secrets.json`` in the data dir, mode 0600, created atomically on first start.
The data dir is 0700 and its spool's files 0600 (:func:`restrict_data_dir`, on every start).
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


# The data dir holds the secrets, the database and the spool's request rows (user ids, source
# IPs, user agents): only meshfast's own user may read any of it, whatever the umask.
DIR_MODE = 0o700
FILE_MODE = 0o600


def owner_only(path: Path, mode: int) -> None:
    """Narrow ``path`` to ``mode`` when it grants more (never widens what an operator narrowed)."""
    current = path.stat().st_mode & 0o777
    if current & ~mode:
        os.chmod(path, current & mode)


# The data dir when the embedded database runs as a user of its own (pgserver does, run as
# root): others may pass through to the database (that user's processes run without its group,
# so group access is not enough), and may list nothing. What lies inside keeps its own modes
# (secrets 0600, spool 0700, the database's directory 0700 and its user's).
DIR_MODE_DATABASE_USER = 0o711


def ensure_data_dir(data_dir: Path, pgdata: Path | None = None) -> None:
    """Create the data dir 0700, and narrow one an earlier run (or an operator) left wider.

    When the embedded database in ``pgdata`` belongs to another user, the data dir is exactly
    0711 instead: any narrower and the database (and ``pg_ctl``, run as that user) could no
    longer reach its own directory; a data dir shared by several meshfast processes (a serve, a
    migrate, a restart) must never be narrowed under a running database."""
    data_dir.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    try:
        database = pgdata.stat() if pgdata is not None else None
    except FileNotFoundError:
        database = None
    if database is None or database.st_uid == os.getuid():
        owner_only(data_dir, DIR_MODE)
        return
    if data_dir.stat().st_mode & 0o777 != DIR_MODE_DATABASE_USER:
        os.chmod(data_dir, DIR_MODE_DATABASE_USER)


def restrict_data_dir(data_dir: Path, spool_dir: Path, pgdata: Path | None = None) -> None:
    """On start: the data dir as :func:`ensure_data_dir` says, the spool 0700, every file in the
    spool 0600, created or not."""
    ensure_data_dir(data_dir, pgdata)
    spool_dir.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    owner_only(spool_dir, DIR_MODE)
    for entry in spool_dir.iterdir():
        if entry.is_file() and not entry.is_symlink():
            owner_only(entry, FILE_MODE)


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
    owner_only(path, FILE_MODE)
    raw = msgspec.json.decode(path.read_bytes(), type=_SecretsFile)
    return Secrets(master_key=bytes.fromhex(raw.master_key), key_pepper=bytes.fromhex(raw.key_pepper))


def new_mesh_key() -> tuple[str, str]:
    """A fresh caller key and its display prefix (``mesh_live_`` + 6 chars + ``...``)."""
    body = base64.urlsafe_b64encode(secrets.token_bytes(32)).rstrip(b"=").decode()
    key = KEY_PREFIX + body
    return key, f"{KEY_PREFIX}{body[:6]}..."


def new_admin_token() -> str:
    return "mesh_admin_" + base64.urlsafe_b64encode(secrets.token_bytes(32)).rstrip(b"=").decode()
