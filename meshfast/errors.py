"""One table from meshfast errors to HTTP status and wire code."""

from __future__ import annotations

from typing import Any

import msgspec


class MeshfastError(Exception):
    """An error that is answered to the caller in the route's own shape."""

    status = 500
    code = "internal_error"

    def __init__(self, detail: str | None = None, *, retry_after_s: int | None = None, **extra: Any) -> None:
        super().__init__(detail or self.code)
        self.detail = detail
        self.retry_after_s = retry_after_s
        self.extra = extra

    def body(self) -> bytes:
        payload: dict[str, Any] = {"error": self.code}
        if self.detail:
            payload["detail"] = self.detail
        payload.update(self.extra)
        return msgspec.json.encode(payload) + b"\n"


def _error(name: str, status: int, code: str) -> type[MeshfastError]:
    return type(name, (MeshfastError,), {"status": status, "code": code})


InvalidRequest = _error("InvalidRequest", 400, "invalid_request")
Unauthorized = _error("Unauthorized", 401, "unauthorized")
InvalidKey = _error("InvalidKey", 401, "invalid_or_revoked_key")
Forbidden = _error("Forbidden", 403, "forbidden")
NotFound = _error("NotFound", 404, "not_found")
UserNotFound = _error("UserNotFound", 404, "user_not_found")
ProviderNotFound = _error("ProviderNotFound", 404, "provider_not_found")
ModelNotFound = _error("ModelNotFound", 404, "model_not_found")
DeploymentNotFound = _error("DeploymentNotFound", 404, "deployment_not_found")
MethodNotAllowed = _error("MethodNotAllowed", 405, "method_not_allowed")
EmailExists = _error("EmailExists", 409, "email_already_exists")
ProviderExists = _error("ProviderExists", 409, "provider_already_exists")
ModelExists = _error("ModelExists", 409, "model_already_exists")
DeploymentExists = _error("DeploymentExists", 409, "deployment_already_exists")
VerificationFailed = _error("VerificationFailed", 422, "model_verification_failed")
PayloadTooLarge = _error("PayloadTooLarge", 413, "payload_too_large")
# The body did not arrive within the body timeouts (idle or total).
RequestTimeout = _error("RequestTimeout", 408, "request_timeout")
# The caller closed its connection before its body was whole (nginx's 499; nobody reads the answer).
ClientDisconnected = _error("ClientDisconnected", 499, "client_disconnected")
UnsupportedMediaType = _error("UnsupportedMediaType", 415, "unsupported_media_type")
ProviderBusy = _error("ProviderBusy", 503, "provider_busy")
PreconditionRequired = _error("PreconditionRequired", 428, "if_match_required")
VersionConflict = _error("VersionConflict", 409, "version_conflict")
IdempotencyConflict = _error("IdempotencyConflict", 422, "idempotency_key_reused")
ServerBusy = _error("ServerBusy", 503, "server_busy")
DatabaseUnavailable = _error("DatabaseUnavailable", 503, "database_unavailable")
