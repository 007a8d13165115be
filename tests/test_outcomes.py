"""The data plane's one outcome table (core/src/outcome.rs, exported as ``meshfast._core.OUTCOMES``)
against API.md, and Python's exceptions and metrics against the table."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from meshfast import errors, metrics
from meshfast._core import OUTCOMES, entry_error

# API.md, the HTTP contract, where the workspace keeps it (MESHFAST_API_MD overrides).
_API_MD = Path(os.environ.get("MESHFAST_API_MD", "/work/shared/API.md"))

# The Mesh-native routes' error list and the standard routes' codes, as API.md states them (the
# tests below also parse the document itself when it is at hand).
DOCUMENTED = {
    "invalid_or_revoked_key": 401,
    "model_not_permitted": 403, "model_blocked": 403, "outside_allowed_hours": 403,
    "provider_hourly_limit_reached": 429, "user_model_hourly_limit_reached": 429, "budget_exceeded": 429,
    "paused_by_admin": 503, "server_busy": 503, "provider_busy": 503,
    "invalid_request": 400, "content_type_not_supported_by_model": 400,
    "payload_too_large": 413,
    "upstream_unavailable": 502,
    "model_not_found": 404,
    "upstream_rate_limited": 429,
}


def _mesh_error_list(text: str) -> dict[str, int]:
    """The paragraph "Errors on these routes: ..." of the Mesh-native routes: status, then its codes."""
    start = text.index("Errors on these routes:")
    paragraph = text[start:text.index("\n\n", start)]
    found: dict[str, int] = {}
    for status, codes in re.findall(r"(\d{3}) ((?:`[a-z_]+`(?:,\s*|\s*)?)+)", paragraph):
        for code in re.findall(r"`([a-z_]+)`", codes):
            found[code] = int(status)
    return found


def test_every_documented_code_has_its_documented_status() -> None:
    """Each code in API.md's error lists is in the core's table with the status API.md gives it."""
    for code, status in DOCUMENTED.items():
        assert code in OUTCOMES, code
        assert OUTCOMES[code].status == status, code


@pytest.mark.skipif(not _API_MD.exists(), reason="API.md is not at hand")
def test_the_table_matches_api_md_itself() -> None:
    """Parsed from API.md: the Mesh-native error list, and the standard routes' 404/429/502 codes."""
    text = _API_MD.read_text()
    listed = _mesh_error_list(text)
    assert len(listed) >= 14, listed
    for code, status in listed.items():
        assert OUTCOMES[code].status == status, code
    assert "`model_not_found`" in text and "`upstream_rate_limited`" in text
    assert {code: OUTCOMES[code].status for code in ("model_not_found", "upstream_rate_limited")} == {
        "model_not_found": 404, "upstream_rate_limited": 429}


def test_python_exceptions_take_code_and_status_from_the_core() -> None:
    """Every exception whose code the core knows answers with the core's status; the rest are admin-only."""
    classes = [c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, errors.MeshfastError)]
    assert errors.MeshfastError in classes
    codes = [c.code for c in classes]
    assert len(codes) == len(set(codes)), "a code is spelled twice in meshfast.errors"
    in_core = [c for c in classes if c.code in OUTCOMES]
    for cls in in_core:
        assert cls.status == OUTCOMES[cls.code].status, cls.__name__
    for name in ("InvalidRequest", "InvalidKey", "PayloadTooLarge", "RequestTimeout", "ClientDisconnected",
                 "ProviderBusy", "ServerBusy", "UpstreamUnavailable", "UpstreamRateLimited", "ModelNotFound"):
        assert getattr(errors, name) in in_core, name
    assert errors.MeshfastError.code == "internal_error" and errors.MeshfastError.status == 500


def test_metrics_count_every_deny_reason_of_the_table() -> None:
    """The deny-reason series are the table's denials (plus ``other``), none of its wire-only codes."""
    assert metrics.DENY_REASONS[-1] == "other"
    assert set(metrics.DENY_REASONS[:-1]) == {code for code, spec in OUTCOMES.items() if spec.denial}
    for code in ("model_not_found", "upstream_unavailable", "upstream_rate_limited", "upstream_incomplete"):
        assert code not in metrics.DENY_REASONS


def test_retry_flags_follow_the_contract() -> None:
    """Denials that end (429, 503) carry Retry-After; only budget_exceeded says x-should-retry: false."""
    for code, spec in OUTCOMES.items():
        assert spec.code == code
        if spec.denial and spec.status in (429, 503):
            assert spec.retry_after, code
        assert spec.retryable == (code != "budget_exceeded"), code


@pytest.mark.parametrize("fmt", ["openai_chat", "openai_responses", "anthropic", "gemini", "ollama"])
def test_entry_errors_carry_the_tables_sentence(fmt: str) -> None:
    """The entry shapes' message is the table's sentence for the code (one place for both)."""
    for code, spec in OUTCOMES.items():
        body = json.loads(entry_error(fmt, spec.status, code))
        message = body["error"] if fmt == "ollama" else body["error"]["message"]
        assert message == spec.message, (fmt, code)
        assert code in json.dumps(body), (fmt, code)
