"""The OpenAPI 3.1 document of the admin API, served at ``GET /admin/openapi.json``.

Request bodies are the admin service's own msgspec structs, so their schemas cannot drift from
what the routes decode, limits included (:mod:`meshfast.validate`'s table); the limits every body
gets from :func:`meshfast.validate.check` are added where a struct sets none. The operation list
is checked against the router's table, and the document against the OpenAPI specification, by
tests.
"""

from __future__ import annotations

from typing import Any

import msgspec

from meshfast import errors, rules, validate
from meshfast.admin import applications, auth, business_units, changes, issuers, logs, notifications, pilots, workflows
from meshfast.admin import service as svc


def _struct(name: str) -> Any:
    return (getattr(svc, name, None) or getattr(notifications, name, None) or getattr(rules, name, None)
            or getattr(issuers, name, None) or getattr(workflows, name, None) or getattr(applications, name, None)
            or getattr(business_units, name, None) or getattr(changes, name, None) or getattr(pilots, name, None)
            or getattr(auth, name))

# (method, path, summary, body struct name in the service or None, success status)
OPERATIONS: tuple[tuple[str, str, str, str | None, int], ...] = (
    ("POST", "/admin/users", "Create a user and its first key (shown once)", "UserCreate", 201),
    ("GET", "/admin/users", "List users", None, 200),
    ("GET", "/admin/users/{id}", "One user (manager, business unit, tier, expiry), with its ETag", None, 200),
    ("PUT", "/admin/users/{id}", "Update a user's name, manager, business unit, tier or expiry (If-Match; null "
     "clears; 409 manager_cycle when the chain would loop)", "UserUpdate", 200),
    ("DELETE", "/admin/users/{id}", "Delete a user", None, 200),
    ("POST", "/admin/users/{id}/rotate-key", "Issue a new key; the previous one stops working (a revoked user "
     "is active again; a business-unit administrator may not reactivate one: 403 forbidden)", None, 200),
    ("POST", "/admin/users/{id}/revoke", "Revoke a user's key", None, 200),
    ("PUT", "/admin/users/{id}/expiry", "Set or clear when the user's keys stop working (Mesh's route; a "
     "business-unit administrator may only bring it forward: later or null 403 forbidden)",
     "ExpiryBody", 200),
    ("PUT", "/admin/users/{id}/key/expiry", "Set or clear when the user's primary key stops working (a "
     "business-unit administrator may only bring it forward: later or null 403 forbidden)",
     "ExpiryBody", 200),
    ("POST", "/admin/users/{id}/keys", "Issue a named key (optional expiry and model subset; the key shown once; "
     "409 key_name_exists when a current key has the name)", "KeyCreate", 201),
    ("GET", "/admin/users/{id}/keys", "A user's keys: prefix, name, models, expiry, status, never the key", None, 200),
    ("POST", "/admin/keys/{id}/rotate", "Issue the key's successor (same name, models and expiry); the old key "
     "works overlap_s more seconds, then 401 (409 key_not_current for a revoked or rotated key)", "KeyRotate", 200),
    ("DELETE", "/admin/keys/{id}", "Revoke a key at once (an application's: not by a business-unit "
     "administrator, 403)", None, 200),
    ("POST", "/admin/issuers", "Trust a platform token issuer: an inline JWK Set or a jwks_url fetched in the "
     "background (platform administrators only; 409 issuer_already_exists)", "IssuerCreate", 201),
    ("GET", "/admin/issuers", "Platform token issuers, with their usable keys and the last fetch's outcome", None, 200),
    ("GET", "/admin/issuers/{id}", "One platform token issuer", None, 200),
    ("DELETE", "/admin/issuers/{id}", "Stop trusting an issuer: its tokens are refused (unknown_issuer)", None, 200),
    ("POST", "/admin/applications", "Register an application (a principal with its own keys, grants, policies and "
     "spend rules) and its first key (shown once); 409 application_already_exists", "ApplicationCreate", 201),
    ("GET", "/admin/applications", "List applications with their owner, business unit and key prefix", None, 200),
    ("GET", "/admin/applications/{id}", "One application, with its ETag", None, 200),
    ("PUT", "/admin/applications/{id}", "Rename an application, change its owner or business unit, or revoke "
     "(status) it (If-Match optional; null clears the business unit)", "ApplicationUpdate", 200),
    ("DELETE", "/admin/applications/{id}", "Delete an application, its keys, grants and policies (rows stay)", None,
     200),
    ("POST", "/admin/applications/{id}/keys", "Issue an application a named key (as a user's)", "KeyCreate", 201),
    ("GET", "/admin/applications/{id}/keys", "An application's keys, never the key", None, 200),
    ("GET", "/admin/applications/{id}/policies", "An application's policies", None, 200),
    ("PUT", "/admin/applications/{id}/policies/{model}", "Set an application's policy on a model (upsert)",
     "PolicyBody", 200),
    ("PUT", "/admin/dlp/policies/{name}", "Create or replace a data protection policy: an action per detector "
     "(block, pseudonymize, redact, off), custom patterns, applies_to (400 invalid_policy lists every problem)",
     None, 200),
    ("GET", "/admin/dlp/policies", "Data protection policies", None, 200),
    ("DELETE", "/admin/dlp/policies/{name}", "Delete a data protection policy", None, 200),
    ("POST", "/admin/workflows", "Register a workflow budget: calls tagged workflow=<id> reserve against limit_usd per "
     "window; principals (user_id, application_id, business_unit) limit who may charge it "
     "(409 workflow_already_exists)",
     "WorkflowCreate", 201),
    ("GET", "/admin/workflows", "Registered workflows with their spend in the current window", None, 200),
    ("GET", "/admin/workflows/{id}", "One workflow", None, 200),
    ("DELETE", "/admin/workflows/{id}", "Unregister a workflow (its id becomes attribution only)", None, 200),
    ("POST", "/admin/session-token", "A short-lived data-plane token (EdDSA JWT) for the logged-in admin's own "
     "user (the user with the admin's email); verified with GET /.well-known/jwks.json", None, 201),
    ("GET", "/admin/users/{id}/policies", "A user's policies", None, 200),
    ("PUT", "/admin/users/{id}/policies/{model}", "Set a user's policy on a model (upsert)", "PolicyBody", 200),
    ("POST", "/admin/providers", "Create a provider (its key is sealed, never returned)", "ProviderCreate", 201),
    ("GET", "/admin/providers", "List providers", None, 200),
    ("GET", "/admin/providers/{id}", "One provider, with its ETag", None, 200),
    ("DELETE", "/admin/providers/{id}", "Delete a provider", None, 200),
    ("POST", "/admin/models", "Create a model", "ModelCreate", 201),
    ("GET", "/admin/models", "List models", None, 200),
    ("GET", "/admin/models/{id}", "One model, with its ETag", None, 200),
    ("DELETE", "/admin/models/{id}", "Delete a model (409 model_in_use with controls: [{kind, id}] naming the rules "
     "that scope it and the live pilots that list it)", None, 200),
    ("POST", "/admin/models/{id}/graduate", "Make a staged or limited model generally available (active): its "
     "roster and limited-access cap are cleared; audited model.graduate", None, 200),
    ("POST", "/admin/pilots", "Create a pilot (members, models, authoritative, mode, expires_at, tiers; "
     "activate_at schedules it): 201 with its ETag, saved_revision and enforced_revision; 400 invalid_pilot with "
     "errors listing every problem (unknown members or models, a member enrolled in another live pilot, tiers "
     "sharing an amount, an empty name); a business-unit administrator's pilot with members outside its units is "
     "403, one that relaxes (adds access) waits for approval (202)", "PilotBody", 201),
    ("GET", "/admin/pilots", "List pilots (with live: not expired, saved_revision, enforced_revision, scheduled); "
     "a business-unit administrator lists those whose members are all in its units", None, 200),
    ("GET", "/admin/pilots/{id}", "One pilot, with its ETag and revisions", None, 200),
    ("PUT", "/admin/pilots/{id}", "Replace a pilot (If-Match: missing 428, stale 409; validated as on create; "
     "activate_at schedules it)", "PilotBody", 200),
    ("DELETE", "/admin/pilots/{id}", "Delete a pilot (its rules' population.pilots then match nobody; "
     "?activate_at= schedules it; a business-unit administrator's delete waits for approval)", None, 200),
    ("POST", "/admin/models/{id}/deployments", "Add a deployment to a model", "DeploymentCreate", 201),
    ("GET", "/admin/models/{id}/deployments", "A model's deployments", None, 200),
    ("DELETE", "/admin/models/{id}/deployments/{deployment}", "Remove a deployment", None, 200),
    ("POST", "/admin/access", "Grant a user or an application a model", "AccessBody", 200),
    ("DELETE", "/admin/access", "Revoke a grant", "AccessBody", 200),
    ("POST", "/admin/kill-switch", "Trip or reset the kill switch (super admin)", "KillSwitchBody", 200),
    ("PUT", "/admin/providers/{id}", "Update a provider (If-Match; an empty api_key keeps the key)", "ProviderCreate",
     200),
    ("PUT", "/admin/models/{id}", "Update a model, or only its status (active, blocked, retired, staged, limited), "
     "roster, limited-access cap and/or restrictions with a body {status?, roster?, limited?, restrictions?} "
     "(If-Match); restrictions and the roster name existing users by id, null clears them, left out keeps them; "
     "a status other than limited clears the roster and the cap", "ModelUpdate", 200),
    ("GET", "/admin/rules", "List spend rules (each as authored, thresholds as decimal strings, with version, "
     "created_at and updated_at)", None, 200),
    ("POST", "/admin/rules", "Create a spend rule: 201 with its ETag; 400 invalid_rule with errors listing every "
     "problem (unordered caps against the stored rules included); 409 rule_already_exists", "RuleBody", 201),
    ("GET", "/admin/rules/{id}", "One spend rule, with its ETag", None, 200),
    ("PUT", "/admin/rules/{id}", "Replace a spend rule (If-Match: missing 428, stale 409; the body's id, if any, "
     "is the path's; version and timestamps in the body are ignored)", "RuleBody", 200),
    ("DELETE", "/admin/rules/{id}", "Delete a spend rule (?activate_at= schedules it; a business-unit "
     "administrator's delete answers 202 {change_id, status: pending})", None, 200),
    ("POST", "/admin/rules/dry-run", "A draft rule (validated, not stored) against the current counters: "
     "{affected: [{user_id, entry, action, spend_usd, threshold_usd, utilization}]}; nothing is written",
     "RuleBody", 200),
    ("GET", "/admin/changes", "The approval queue, newest first: {changes: [{id, kind, target, action, body, "
     "base_version, digest, status, requested_by, requested_by_admin_id, business_unit, activate_at, comment, "
     "decided_by, created_at, decided_at, expires_at}], total, page, page_size}; a business-unit administrator "
     "sees its units' changes only", None, 200),
    ("GET", "/admin/changes/{id}", "One change, with its digest as the ETag", None, 200),
    ("POST", "/admin/changes/{id}/approve", "Apply the exact change reviewed (at its activate_at when still ahead; "
     "platform administrators only): 403 self_approval for its requester, 409 change_modified when If-Match is "
     "not its digest, version_conflict when the control changed since, change_expired, change_not_pending",
     None, 200),
    ("POST", "/admin/changes/{id}/reject", "Reject a pending change, saying why (400 comment_required; platform "
     "administrators only, 403 self_approval for its requester)", "RejectBody", 200),
    ("GET", "/admin/enforcement", "The global switch of rules in mode inherit: {enforce}", None, 200),
    ("PUT", "/admin/enforcement", "Set the global switch (rules only; per-user policies always enforce)",
     "EnforcementBody", 200),
    ("POST", "/admin/login", "Log in: session and CSRF cookies, the CSRF token in the body", "LoginBody", 200),
    ("HEAD", "/admin/oidc/login", "Whether admins may sign in through an OIDC issuer: 204 when one is configured, "
     "404 otherwise (nothing is stored and no login attempt is spent; the dashboard's login form asks)", None, 204),
    ("GET", "/admin/oidc/login", "Begin an admin login through the OIDC issuer (MESHFAST_OIDC_ISSUER): 302 to its "
     "authorization endpoint (authorization code with PKCE S256), a short-lived state cookie; no credentials; "
     "throttled per address as /admin/login (429 too_many_attempts); 404 not_found when no issuer is configured; "
     "502 oidc_unavailable when the issuer does not answer", None, 302),
    ("GET", "/admin/oidc/callback", "Finish an OIDC login: 302 to /dashboard with the session and CSRF cookies of "
     "/admin/login. 400 invalid_state (state missing, not the cookie's, used or expired), 400 oidc_denied (the "
     "issuer's error), 400 oidc_exchange_failed (the code refused), 401 invalid_id_token (signature, iss, aud, "
     "time, nonce or an unverified email), 401 invalid_credentials (a paused admin), 403 no_role (the role claim "
     "names neither the platform role nor an existing business unit's); 404 not_found when no issuer is "
     "configured", None, 302),
    ("POST", "/admin/logout", "End this session", None, 200),
    ("GET", "/admin/me", "Who is asking: {email, is_super_admin, session}, and for a platform or business-unit "
     "administrator role (platform or business_unit) and business_units (its units, or null)", None, 200),
    ("POST", "/admin/change-password", "Change this session's password (ends its other sessions)",
     "PasswordChange", 200),
    ("GET", "/admin/admins", "List admins", None, 200),
    ("POST", "/admin/admins", "Create an admin (a super admin only by a super admin)", "AdminCreate", 201),
    ("POST", "/admin/admins/{id}/pause", "Pause an admin (super admin)", None, 200),
    ("POST", "/admin/admins/{id}/resume", "Resume an admin (super admin)", None, 200),
    ("DELETE", "/admin/admins/{id}", "Delete an admin (super admin)", None, 200),
    ("GET", "/admin/tokens", "List admin API tokens, with owner_admin_id and business_units (a business-unit "
     "administrator lists its own)", None, 200),
    ("POST", "/admin/tokens", "Create an admin API token (shown once); business_units scopes it to those units "
     "(400 for an unknown unit or beside is_super); a business-unit administrator's token is scoped to its units or "
     "some of them (all by default; another unit 403)", "TokenCreate", 201),
    ("DELETE", "/admin/tokens/{id}", "Revoke an admin API token (a business-unit administrator: its own only, "
     "and none reaching further than the caller)",
     None, 200),
    ("POST", "/admin/business-units", "Create a business unit {name, timezone, admins, daily_cap_lock_usd} "
     "(platform administrators only): 201 {id, name, timezone, admins, daily_cap_lock_usd, version, created_at, "
     "updated_at} with its ETag; 400 invalid_request listing every problem (a time zone Python or PostgreSQL does "
     "not know, an unknown admin, a platform administrator as a unit's); 409 business_unit_already_exists. "
     "daily_cap_lock_usd is the highest daily cap the unit's administrators may set on its people's policies "
     "(null: none above the cap in force, a policy's or the $20 default; above: 403 above_platform_lock)",
     "BusinessUnitBody", 201),
    ("GET", "/admin/business-units", "Business units (a business-unit administrator: its own)", None, 200),
    ("GET", "/admin/business-units/{id}", "One business unit, with its ETag (another unit than a business-unit "
     "administrator's answers 404 business_unit_not_found)", None, 200),
    ("PUT", "/admin/business-units/{id}", "Replace a business unit (platform administrators only; If-Match honoured "
     "when sent: stale 409 version_conflict; admins left out: kept); a rename carries the name to tokens scoped to "
     "the unit, its people's business_unit, models' closed and open lists and rules' population.business_units "
     "(log rows and audit records keep the old name); an administrator removed from its last unit is scoped to "
     "none, never unscoped",
     "BusinessUnitBody", 200),
    ("GET", "/admin/logs", "Request logs: filters, paging, sorting, search", None, 200),
    ("GET", "/admin/logs/summary", "Totals, time series and breakdowns from the rollups (mesh-behaviour §3.5's "
     "names beside meshfast's own); with group_by (business_unit, manager, tier or tag) also groups: [{key, "
     "calls, denied_calls, error_calls, tokens_in, tokens_out, input_cost_usd, output_cost_usd, cost_usd, "
     "cost_nano_usd}] from the values each row kept at call time (null key: rows without one; by tag a row "
     "counts once per tag its model had). Costs are exact: cost_usd a JSON number with nine decimals, "
     "cost_nano_usd an integer; total_cost_nano_usd is the exact total. by_tool (context signals): [{tool, "
     "declared_calls, invoked_calls, invocation_rate, estimated_tokens_per_declaration}], the most declared "
     "first (user and model filters apply; successful calls are counted, and a tool counts as called only "
     "where it was declared)", None, 200),
    ("GET", "/admin/logs/unused-tools", "Context signals: per person, the tools declared in the window "
     "(default the last 24 hours) that the model never called, with the prompt tokens per request removing "
     "them would save, estimated from their definitions' size at bytes_per_token: {from, to, bytes_per_token, "
     "users: [{user_id, user_email, estimated_tokens_in_window, tools: [{tool, "
     "declared_calls, estimated_tokens_per_request}]}]}", None, 200),
    ("GET", "/admin/logs/export.csv", "Every row /admin/logs lists for the same filters (no paging), as CSV: a "
     "header line, then one line per row, newest first (order=asc: oldest); costs as exact decimals; cells "
     "starting with = + - @ are prefixed with '", None, 200),
    ("GET", "/admin/audit", "The audit log, filtered", None, 200),
    ("GET", "/admin/notifications", "The spend rules' notification channels (webhook_secret_set and "
     "smtp.password_set say whether a secret is stored; secrets are never returned)", None, 200),
    ("PUT", "/admin/notifications", "Set the notification channels: a field left out is kept, null clears it; "
     "webhook_url is refused as SSRF unless webhook_local; secrets are sealed", "NotificationsBody", 200),
    ("GET", "/admin/notifications/deliveries", "Notification deliveries (the outbox), newest first: {deliveries: "
     "[{delivery_id, rule_id, entry, user_id, action, channel, window, window_start, threshold_usd, spend_usd, "
     "status, attempts, last_error, next_attempt_at, created_at, delivered_at}], total, page, page_size}", None, 200),
    ("GET", "/admin/status", "This worker's view of the instance (not for a business-unit administrator: 403), "
     "with instance: {id, mode (lone: holds every "
     "cap whole; cluster: caps and provider limits leased), lease_grants} and instances: [{id, host, port, "
     "started_at, last_seen, workers, alive (a heartbeat within 10 s), mode}], every instance on this database "
     "(null when the database does not answer)", None, 200),
    ("GET", "/admin/metrics", "Prometheus counters of the instance", None, 200),
    ("GET", "/admin/openapi.json", "This document", None, 200),
)

_ERROR = {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}}}
# Writes of a control (API.md "Governed lifecycle"): a business-unit administrator's relaxing one
# waits for approval; each takes activate_at (in the body, or the query of a DELETE).
GOVERNED = {("POST", "/admin/rules"), ("PUT", "/admin/rules/{id}"), ("DELETE", "/admin/rules/{id}"),
            ("PUT", "/admin/models/{id}"), ("PUT", "/admin/users/{id}/policies/{model}"),
            ("PUT", "/admin/applications/{id}/policies/{model}"), ("POST", "/admin/pilots"),
            ("PUT", "/admin/pilots/{id}"), ("DELETE", "/admin/pilots/{id}")}
_PENDING = {"description": "a business-unit administrator's relaxing write: queued for a platform administrator",
            "content": {"application/json": {"schema": {
                "type": "object", "required": ["change_id", "status"],
                "properties": {"change_id": {"type": "string", "format": "uuid"}, "status": {"const": "pending"},
                               "digest": {"type": "string"}}}}}}
_ERRORS = {
    "400": f"{errors.InvalidRequest.code}: malformed JSON, a wrong type or an unknown field",
    "401": f"{errors.Unauthorized.code}: no valid admin token",
    "403": f"{errors.Forbidden.code}: the operation needs a super admin, or is outside the business units of a "
           f"business-unit administrator ({errors.AbovePlatformLock.code}: a policy cap above the unit's lock)",
    "404": "not found",
    "405": errors.MethodNotAllowed.code,
    "409": "conflict (a duplicate name, a stale If-Match, or manager_cycle)",
    "413": errors.PayloadTooLarge.code,
    "422": f"{errors.VerificationFailed.code}: the live verification call failed",
    "428": "If-Match required",
    "503": "database unavailable",
}


def _query(name: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "description": description, "schema": schema}


_TEXT = {"type": "string", "maxLength": validate.MAX_QUERY_TEXT}
_TIME = {"type": "string", "format": "date-time", "maxLength": 64,
         "description": f"ISO 8601, between {validate.EARLIEST.date()} and {validate.LATEST.date()}"}
_UUID = {"type": "string", "format": "uuid", "maxLength": 64}
_PAGING = [_query("page", {"type": "integer", "minimum": 1, "maximum": 1_000_000}, "page number, from 1"),
           _query("page_size", {"type": "integer", "minimum": 1, "maximum": logs.MAX_PAGE_SIZE}, "rows per page")]
_LOG_FILTERS = [
    _query("user_id", _UUID, "one user's requests"),
    _query("model_id", _UUID, "one model's requests"),
    _query("status", {"type": "string", "enum": list(logs.STATUS_OUTCOME)}, "outcome"),
    _query("from", _TIME, "start of the window (inclusive)"),
    _query("to", _TIME, "end of the window (exclusive)"),
    *_PAGING,
    _query("sort", {"type": "string", "enum": list(logs.SORTS)}, "sort key"),
    _query("order", {"type": "string", "enum": ["asc", "desc"]}, "sort order"),
    _query("q", _TEXT, "an exact request id, or part of a model name"),
    _query("request_id", _TEXT, "one request id (exact)"),
    _query("tz", {"type": "string", "maxLength": 64}, "IANA time zone of the summary's buckets"),
    _query("bucket", {"type": "string", "enum": ["hour", "day"]}, "time-series bucket"),
    _query("business_unit", _TEXT, "one business unit's rows (the row's own, from call time); a business-unit "
           "administrator reads its units' rows only, and another unit here is 403"),
]
_GROUP_BY = _query("group_by", {"type": "string", "enum": list(logs.GROUP_BY)},
                   "summary only: group by the row's business unit, manager, tier or model tag at call time")
QUERY_PARAMETERS: dict[str, list[dict[str, Any]]] = {
    "/admin/logs": _LOG_FILTERS,
    "/admin/logs/summary": [*_LOG_FILTERS, _GROUP_BY],
    "/admin/logs/unused-tools": [p for p in _LOG_FILTERS if p["name"] in ("user_id", "model_id", "from", "to")],
    "/admin/logs/export.csv": [
        _query("sort", {"type": "string", "enum": ["created_at"]}, "the export's order is by time")
        if p["name"] == "sort" else p
        for p in _LOG_FILTERS if p["name"] not in ("page", "page_size", "tz", "bucket")],
    "/admin/notifications/deliveries": [
        _query("status", {"type": "string", "enum": list(notifications.STATUSES)}, "delivery status"),
        _query("channel", {"type": "string", "enum": list(notifications.CHANNELS)}, "webhook or email"),
        _query("action", {"type": "string", "enum": list(notifications.ACTIONS)}, "notify or digest"),
        _query("rule_id", _TEXT, "one rule's deliveries (digests have rule_id *)"),
        _query("user_id", _UUID, "one person's deliveries (a digest's person is the leader)"),
        *_PAGING],
    "/admin/oidc/callback": [_query("code", _TEXT, "the issuer's authorization code"),
                             _query("state", _TEXT, "the state of the login (as the state cookie)"),
                             _query("iss", _TEXT, "the issuer (RFC 9207), when it says"),
                             _query("error", _TEXT, "the issuer's refusal"),
                             _query("error_description", _TEXT, "the issuer's words on its refusal")],
    "/admin/changes": [_query("status", {"type": "string", "enum": list(changes.STATUSES)}, "the changes' status"),
                       _query("page", {"type": "integer", "minimum": 1, "maximum": 1_000_000}, "page number, from 1"),
                       _query("page_size", {"type": "integer", "minimum": 1, "maximum": changes.MAX_PAGE_SIZE},
                              "changes per page")],
    "DELETE /admin/rules/{id}": [_query("activate_at", {"type": "string", "maxLength": 64},
                                        'when the delete goes live: RFC 3339 with an offset, or "local-midnight"')],
    "DELETE /admin/pilots/{id}": [_query("activate_at", {"type": "string", "maxLength": 64},
                                         'when the delete goes live: RFC 3339 with an offset, or "local-midnight"')],
    "/admin/audit": [_query("actor", _TEXT, "who acted (exact)"), _query("action", _TEXT, "what was done (exact)"),
                     _query("from", _TIME, "start (inclusive)"), _query("to", _TIME, "end (exclusive)"),
                     _query("business_unit", _TEXT, "the records of changes concerning one business unit (a "
                            "business-unit administrator reads its units' records only; another unit is 403)"),
                     *_PAGING],
}


def _limits(schema: Any) -> None:
    """Give every string, array and object in ``schema`` the generic limits
    :func:`meshfast.validate.check` holds them to, where the struct sets no tighter one; decimals
    (prices) take JSON numbers as well as numeric strings."""
    if isinstance(schema, list):
        for item in schema:
            _limits(item)
        return
    if not isinstance(schema, dict):
        return
    kind = schema.get("type")
    if kind == "string" and schema.get("format") == "decimal":
        schema["type"] = ["string", "number"]
        if "default" in schema:
            schema["default"] = str(schema["default"])
    elif kind == "string":
        schema.setdefault("maxLength", validate.MAX_TEXT)
    elif kind == "array":
        schema.setdefault("maxItems", validate.MAX_ITEMS)
    elif kind == "object" and "additionalProperties" in schema:
        schema.setdefault("maxProperties", validate.MAX_ITEMS)
    for value in schema.values():
        _limits(value)


def document() -> dict[str, Any]:
    structs = sorted({body for *_, body, _ in OPERATIONS if body}, key=str)
    _, components = msgspec.json.schema_components([_struct(name) for name in structs],
                                                   ref_template="#/components/schemas/{name}")
    _limits(components)
    paths: dict[str, dict[str, Any]] = {}
    for method, path, summary, body, status in OPERATIONS:
        params = [{"name": name.strip("{}"), "in": "path", "required": True, "schema": {"type": "string"}}
                  for name in path.split("/") if name.startswith("{")]
        operation: dict[str, Any] = {
            "summary": summary,
            "operationId": f"{method.lower()}_{path.strip('/').replace('/', '_').replace('{', '').replace('}', '')}",
            "responses": {str(status): {"description": "success", "content": {"application/json": {"schema": {}}}},
                          **{code: {"description": text, "content": {"application/json": {"schema": _ERROR}}}
                             for code, text in _ERRORS.items()}},
        }
        if (method, path) in GOVERNED:
            operation["responses"]["202"] = _PENDING
        if status == 204:
            operation["responses"]["204"] = {"description": "no content"}
        if path == "/admin/metrics":
            operation["responses"][str(status)] = {"description": "Prometheus text",
                                                   "content": {"text/plain": {"schema": {"type": "string"}}}}
        if path == "/admin/logs/export.csv":
            operation["responses"][str(status)] = {
                "description": "CSV (RFC 4180), columns: " + ", ".join(logs.EXPORT_HEADER),
                "content": {"text/csv": {"schema": {"type": "string"}}}}
        if status == 302:
            operation["responses"]["302"] = {
                "description": "a redirect (Location)",
                "headers": {"Location": {"schema": {"type": "string", "maxLength": 4096}}}}
            operation["responses"]["429" if path.endswith("/login") else "502"] = {
                "description": "too_many_attempts" if path.endswith("/login") else "oidc_unavailable",
                "content": {"application/json": {"schema": _ERROR}}}
        if path not in ("/admin/openapi.json", "/admin/login", "/admin/oidc/login", "/admin/oidc/callback"):
            operation["security"] = [{"bearer": []}]
        params.extend(QUERY_PARAMETERS.get(path if method == "GET" else f"{method} {path}", []))
        if params:
            operation["parameters"] = params
        if body:
            operation["requestBody"] = {"required": True, "content": {"application/json": {
                "schema": {"$ref": f"#/components/schemas/{_struct(body).__name__}"}}}}
        paths.setdefault(path, {})[method.lower()] = operation
    return {
        "openapi": "3.1.0",
        "info": {"title": "meshfast admin API", "version": "1",
                 "description": "Providers, models, users, keys, grants, policies and the kill switch."},
        "paths": paths,
        "components": {"schemas": components,
                       "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer",
                                                      "description": "an admin token"}}},
    }


def encoded() -> bytes:
    return msgspec.json.encode(document()) + b"\n"
