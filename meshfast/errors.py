"""One table from meshfast errors to HTTP status and wire code.

The data plane's codes and statuses are the core's (``meshfast._core.OUTCOMES``, one Rust table):
an exception here names its code and takes the status from there, so neither is written twice.
Codes only the admin plane answers are spelled in this table alone."""

from __future__ import annotations

from typing import Any

import msgspec

from meshfast._core import OUTCOMES


class MeshfastError(Exception):
    """An error that is answered to the caller in the route's own shape."""

    status = OUTCOMES["internal_error"].status
    code = OUTCOMES["internal_error"].code

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
    """An admin-plane error, spelled here only (the core never answers it)."""
    assert code not in OUTCOMES, f"{code} is the core's: use _outcome"
    return type(name, (MeshfastError,), {"status": status, "code": code})


def _outcome(name: str, code: str) -> type[MeshfastError]:
    """A data-plane error: its status is the core's (a code the core does not know fails at import)."""
    return type(name, (MeshfastError,), {"status": OUTCOMES[code].status, "code": code})


# The data plane's (and the admin plane's where the code is the same).
InvalidRequest = _outcome("InvalidRequest", "invalid_request")
InvalidKey = _outcome("InvalidKey", "invalid_or_revoked_key")
InvalidTags = _outcome("InvalidTags", "invalid_tags")
ModelNotFound = _outcome("ModelNotFound", "model_not_found")
MethodNotAllowed = _outcome("MethodNotAllowed", "method_not_allowed")
PayloadTooLarge = _outcome("PayloadTooLarge", "payload_too_large")
# The body did not arrive within the body timeouts (idle or total).
RequestTimeout = _outcome("RequestTimeout", "request_timeout")
# The caller closed its connection before its body was whole (nginx's 499; nobody reads the answer).
ClientDisconnected = _outcome("ClientDisconnected", "client_disconnected")
ProviderBusy = _outcome("ProviderBusy", "provider_busy")
ServerBusy = _outcome("ServerBusy", "server_busy")
UpstreamRateLimited = _outcome("UpstreamRateLimited", "upstream_rate_limited")
UpstreamUnavailable = _outcome("UpstreamUnavailable", "upstream_unavailable")
SensitiveContentBlocked = _outcome("SensitiveContentBlocked", "sensitive_content_blocked")

# The admin plane's (and the HTTP layer's).
Unauthorized = _error("Unauthorized", 401, "unauthorized")
Forbidden = _error("Forbidden", 403, "forbidden")
NotFound = _error("NotFound", 404, "not_found")
UserNotFound = _error("UserNotFound", 404, "user_not_found")
ProviderNotFound = _error("ProviderNotFound", 404, "provider_not_found")
DeploymentNotFound = _error("DeploymentNotFound", 404, "deployment_not_found")
EmailExists = _error("EmailExists", 409, "email_already_exists")
ProviderExists = _error("ProviderExists", 409, "provider_already_exists")
ModelExists = _error("ModelExists", 409, "model_already_exists")
DeploymentExists = _error("DeploymentExists", 409, "deployment_already_exists")
VerificationFailed = _error("VerificationFailed", 422, "model_verification_failed")
UnsupportedMediaType = _error("UnsupportedMediaType", 415, "unsupported_media_type")
PreconditionRequired = _error("PreconditionRequired", 428, "if_match_required")
VersionConflict = _error("VersionConflict", 409, "version_conflict")
IdempotencyConflict = _error("IdempotencyConflict", 422, "idempotency_key_reused")
DatabaseUnavailable = _error("DatabaseUnavailable", 503, "database_unavailable")
# Sign-in and admin accounts (meshfast.admin.auth).
InvalidCredentials = _error("InvalidCredentials", 401, "invalid_credentials")
AccountLocked = _error("AccountLocked", 401, "account_locked")
WeakPassword = _error("WeakPassword", 400, "weak_password")
TooManyAttempts = _error("TooManyAttempts", 429, "too_many_attempts")
CsrfFailed = _error("CsrfFailed", 403, "csrf_failed")
AdminNotFound = _error("AdminNotFound", 404, "admin_not_found")
TokenNotFound = _error("TokenNotFound", 404, "token_not_found")
# Named keys (POST /admin/users/{id}/keys): an unknown key, a name the person's current keys
# already use, and a revoked or already rotated key asked to rotate.
KeyNotFound = _error("KeyNotFound", 404, "key_not_found")
IssuerNotFound = _error("IssuerNotFound", 404, "issuer_not_found")
IssuerExists = _error("IssuerExists", 409, "issuer_already_exists")
WorkflowNotFound = _error("WorkflowNotFound", 404, "workflow_not_found")
WorkflowExists = _error("WorkflowExists", 409, "workflow_already_exists")
KeyNameExists = _error("KeyNameExists", 409, "key_name_exists")
# Applications (POST /admin/applications): an unknown one, a name another already has (names are
# unique whatever their case), and a person deleted while they still own one.
ApplicationNotFound = _error("ApplicationNotFound", 404, "application_not_found")
ApplicationExists = _error("ApplicationExists", 409, "application_already_exists")
OwnsApplications = _error("OwnsApplications", 409, "user_owns_applications")
# A data protection policy with problems (``errors`` lists every one).
InvalidPolicy = _error("InvalidPolicy", 400, "invalid_policy")
KeyNotCurrent = _error("KeyNotCurrent", 409, "key_not_current")
CannotModifyOwn = _error("CannotModifyOwn", 400, "cannot_modify_own_account")
# A manager change that would make the reporting chain loop.
ManagerCycle = _error("ManagerCycle", 409, "manager_cycle")
# Spend rules (meshfast.rules): a rule body with problems (``errors`` lists every one), an
# unknown rule, an id already taken, and a dry-run this build's core cannot answer.
InvalidRule = _error("InvalidRule", 400, "invalid_rule")
RuleNotFound = _error("RuleNotFound", 404, "rule_not_found")
RuleExists = _error("RuleExists", 409, "rule_already_exists")
DryRunUnavailable = _error("DryRunUnavailable", 501, "dry_run_unavailable")
# The governed lifecycle (meshfast.admin.changes): the requester deciding its own change, a
# rejection without a reason, a change edited (new digest), decided or expired since it was read.
SelfApproval = _error("SelfApproval", 403, "self_approval")
CommentRequired = _error("CommentRequired", 400, "comment_required")
ChangeModified = _error("ChangeModified", 409, "change_modified")
ChangeExpired = _error("ChangeExpired", 409, "change_expired")
ChangeNotPending = _error("ChangeNotPending", 409, "change_not_pending")
ChangeNotFound = _error("ChangeNotFound", 404, "change_not_found")
# Admin login through an OIDC issuer (meshfast.admin.oidc): a callback whose state is missing,
# unknown, used or expired, or not the browser's; the issuer's refusal of the login; its refusal
# of the code exchange; an ID token that does not verify (signature, issuer, audience, time,
# nonce, a verified email); a person the issuer gives no meshfast role; and an issuer that does
# not answer (or answers something that is not OIDC).
InvalidState = _error("InvalidState", 400, "invalid_state")
OidcDenied = _error("OidcDenied", 400, "oidc_denied")
OidcExchangeFailed = _error("OidcExchangeFailed", 400, "oidc_exchange_failed")
InvalidIdToken = _error("InvalidIdToken", 401, "invalid_id_token")
NoRole = _error("NoRole", 403, "no_role")
OidcUnavailable = _error("OidcUnavailable", 502, "oidc_unavailable")
# Business units (meshfast.admin.business_units, meshfast.admin.scope): an unknown unit, a name
# another unit has, and a unit administrator's policy cap above the platform's lock on the unit.
BusinessUnitNotFound = _error("BusinessUnitNotFound", 404, "business_unit_not_found")
BusinessUnitExists = _error("BusinessUnitExists", 409, "business_unit_already_exists")
AbovePlatformLock = _error("AbovePlatformLock", 403, "above_platform_lock")
# Onboarding and pilots (meshfast.onboarding): a pilot body with problems (``errors`` lists every
# one), an unknown pilot, and a model a live control references (``controls`` names them).
InvalidPilot = _error("InvalidPilot", 400, "invalid_pilot")
PilotNotFound = _error("PilotNotFound", 404, "pilot_not_found")
ModelInUse = _error("ModelInUse", 409, "model_in_use")
