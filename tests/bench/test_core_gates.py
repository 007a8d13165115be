"""pytest-benchmark gates on the in-process request path (run with --benchmark-only).

These are budgets, not functional tests: CI runs them as their own step.
"""

from __future__ import annotations

import uuid

import pytest

from meshfast._core import Core, Segment
from meshfast.secrets import new_mesh_key
from meshfast.snapshot import Config, Grant, Key, Model, Principal, Provider, encode

AUTHENTICATE_BUDGET_S = 2e-6
MODELS_VIEW_BUDGET_S = 20e-6
PEPPER = b"p" * 32


def _config(n_users: int, core_hash) -> tuple[Config, list[str]]:  # type: ignore[no-untyped-def]
    providers = [Provider(id=str(uuid.uuid4()), name="bench", family="openai", max_calls_per_hour=None,
                          supports_web_search=False)]
    models = [
        Model(id=str(uuid.uuid4()), name=f"bench-model-{i}", provider=0, kind="chat", created_ms=0, blocked=False,
              status="active", supports_image_in=False, supports_document_in=False, supports_audio_in=False,
              supports_video_in=False, supports_web_search=False, output_media_type=None,
              input_price_nano_per_1k=1_000_000, output_price_nano_per_1k=2_000_000)
        for i in range(5)
    ]
    principals, keys, grants, tokens = [], [], [], []
    for i in range(n_users):
        token, _ = new_mesh_key()
        tokens.append(token)
        principals.append(Principal(id=str(uuid.uuid4()), email=f"u{i}@example.com", display_name=f"U{i}",
                                    status="active", expires_at_ms=None))
        keys.append(Key(id=str(uuid.uuid4()), principal=i, digest=core_hash(token), status="active",
                        expires_at_ms=None))
        grants += [Grant(principal=i, model=m, daily_cap_nano_usd=20_000_000_000, max_calls_per_hour=None,
                         allowed_from_min=None, allowed_to_min=None, timezone="UTC", active_days=[],
                         always_open=False) for m in range(5)]
    return Config(seq=1, kill_switch=False, principals=principals, keys=keys, providers=providers,
                  models=models, grants=grants), tokens


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Core, list[str]]:
    segment = Segment.create(str(tmp_path_factory.mktemp("seg") / "bench.seg"))
    segment.register()
    core = Core(PEPPER, segment)
    config, tokens = _config(10_000, core.hash_token)
    core.load(encode(config))
    return core, tokens


def test_authenticate_under_2us(benchmark, loaded) -> None:  # type: ignore[no-untyped-def]
    """One authenticate call (SHA-256 + index lookup) among 10 000 keys: median under 2 µs."""
    core, tokens = loaded
    header = f"Bearer {tokens[1234]}"
    assert core.authenticate(header, None, None, None, 0) is not None
    benchmark(core.authenticate, header, None, None, None, 0)
    assert benchmark.stats.stats.median < AUTHENTICATE_BUDGET_S


def test_models_view_under_budget(benchmark, loaded) -> None:  # type: ignore[no-untyped-def]
    """The full GET /v1/models answer for a user with 5 models, built in the core."""
    core, tokens = loaded
    header = f"Bearer {tokens[42]}"
    status, _ = core.models_json(header, None, None, None, 1_764_000_000_000)
    assert status == 200
    benchmark(core.models_json, header, None, None, None, 1_764_000_000_000)
    assert benchmark.stats.stats.median < MODELS_VIEW_BUDGET_S
