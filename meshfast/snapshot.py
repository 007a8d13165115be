"""Builds the core's config bytes from PostgreSQL.

The worker reads configuration through the gateway role in one REPEATABLE READ transaction,
encodes it with msgspec (MessagePack) and hands the bytes to ``Core.load``, which validates
them, builds the immutable snapshot and swaps it in atomically.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import asyncpg
import msgspec

from meshfast.store import sql

NANOS_PER_USD = 1_000_000_000


class Principal(msgspec.Struct):
    id: str
    email: str
    display_name: str
    status: str
    expires_at_ms: int | None


class Key(msgspec.Struct):
    id: str
    principal: int
    digest: bytes
    status: str
    expires_at_ms: int | None


class Provider(msgspec.Struct):
    id: str
    name: str
    family: str
    max_calls_per_hour: int | None
    supports_web_search: bool


class Model(msgspec.Struct):
    id: str
    name: str
    provider: int
    kind: str
    created_ms: int
    blocked: bool
    status: str
    supports_image_in: bool
    supports_document_in: bool
    supports_audio_in: bool
    supports_video_in: bool
    supports_web_search: bool
    output_media_type: str | None
    input_price_nano_per_1k: int
    output_price_nano_per_1k: int


class Grant(msgspec.Struct):
    principal: int
    model: int
    daily_cap_nano_usd: int
    max_calls_per_hour: int | None
    allowed_from_min: int | None
    allowed_to_min: int | None
    timezone: str
    active_days: list[int]
    always_open: bool


class Config(msgspec.Struct):
    seq: int
    kill_switch: bool
    principals: list[Principal]
    keys: list[Key]
    providers: list[Provider]
    models: list[Model]
    grants: list[Grant]


_encoder = msgspec.msgpack.Encoder()


def usd_to_nanos(value: Decimal | int | float | str) -> int:
    """Decimal USD to integer nano-USD, rounded half up."""
    nanos = (Decimal(value) * NANOS_PER_USD).quantize(Decimal(1), rounding="ROUND_HALF_UP")
    return max(0, int(nanos))


def _ms(ts: dt.datetime | None) -> int | None:
    return None if ts is None else int(ts.timestamp() * 1000)


def _minutes(t: dt.time | None) -> int | None:
    return None if t is None else t.hour * 60 + t.minute


async def load_config(conn: asyncpg.Connection) -> Config:
    async with conn.transaction(isolation="repeatable_read", readonly=True):
        seq = await conn.fetchval(sql.SNAPSHOT_SEQ)
        kill_switch = bool(await conn.fetchval(sql.SNAPSHOT_KILL_SWITCH))
        user_rows = await conn.fetch(sql.SNAPSHOT_PRINCIPALS)
        key_rows = await conn.fetch(sql.SNAPSHOT_KEYS)
        provider_rows = await conn.fetch(sql.SNAPSHOT_PROVIDERS)
        model_rows = await conn.fetch(sql.SNAPSHOT_MODELS)
        grant_rows = await conn.fetch(sql.SNAPSHOT_GRANTS)

    principal_index = {row["id"]: i for i, row in enumerate(user_rows)}
    provider_index = {row["id"]: i for i, row in enumerate(provider_rows)}
    models = [row for row in model_rows if row["provider_id"] in provider_index]
    model_index = {row["id"]: i for i, row in enumerate(models)}

    return Config(
        seq=int(seq),
        kill_switch=kill_switch,
        principals=[
            Principal(
                id=str(row["id"]),
                email=row["email"],
                display_name=row["display_name"],
                status=row["status"],
                expires_at_ms=_ms(row["expires_at"]),
            )
            for row in user_rows
        ],
        keys=[
            Key(
                id=str(row["id"]),
                principal=principal_index[row["user_id"]],
                digest=bytes(row["key_hash"]),
                status=row["status"],
                expires_at_ms=_ms(row["expires_at"]),
            )
            for row in key_rows
            if row["user_id"] in principal_index
        ],
        providers=[
            Provider(
                id=str(row["id"]),
                name=row["name"],
                family=row["family"],
                max_calls_per_hour=row["max_calls_per_hour"],
                supports_web_search=row["supports_web_search"],
            )
            for row in provider_rows
        ],
        models=[
            Model(
                id=str(row["id"]),
                name=row["name"],
                provider=provider_index[row["provider_id"]],
                kind=row["kind"],
                created_ms=_ms(row["created_at"]) or 0,
                blocked=row["blocked"],
                status=row["status"],
                supports_image_in=row["supports_image_in"],
                supports_document_in=row["supports_document_in"],
                supports_audio_in=row["supports_audio_in"],
                supports_video_in=row["supports_video_in"],
                supports_web_search=row["supports_web_search"],
                output_media_type=row["output_media_type"],
                input_price_nano_per_1k=usd_to_nanos(row["input_price_per_1k_tokens"]),
                output_price_nano_per_1k=usd_to_nanos(row["output_price_per_1k_tokens"]),
            )
            for row in models
        ],
        grants=[
            Grant(
                principal=principal_index[row["user_id"]],
                model=model_index[row["model_id"]],
                daily_cap_nano_usd=usd_to_nanos(row["daily_cap_usd"]),
                max_calls_per_hour=row["max_calls_per_hour"],
                allowed_from_min=_minutes(row["allowed_from"]),
                allowed_to_min=_minutes(row["allowed_to"]),
                timezone=row["timezone"],
                active_days=list(row["active_days"]),
                always_open=row["always_open"],
            )
            for row in grant_rows
            if row["user_id"] in principal_index and row["model_id"] in model_index
        ],
    )


def encode(config: Config) -> bytes:
    return _encoder.encode(config)
