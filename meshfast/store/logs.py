"""The log explorer's SQL (meshfast/admin/logs.py): request rows, their rollups, the audit log.

Every value is a ``$n`` parameter at a fixed position. What varies from one request to the next
is which optional filters apply, the sort key and direction, and the rollup a view reads; the
functions here only pick among the constant strings below and join them. An optional filter is
either its condition or a test that its parameter is NULL (passed as NULL: always true), so
each combination of filters is its own statement: PostgreSQL plans each with the index its
filters want (``user_id, created_at`` and the like), which one statement holding
``$n IS NULL OR column = $n`` for every combination would not reliably get from a generic plan.

The parameters of the request-row statements: ``$1``, ``$2`` the window, ``$3`` user id,
``$4`` model id, ``$5`` outcome, ``$6`` business units (the rows' own, from call time: a
business-unit administrator's scope, or the ``business_unit`` filter), ``$7`` search text, ``$8``
request id, then each statement's own (a page's limit and offset, a keyset position). The
rollups' take ``$1``-``$6`` alike.
"""

# --- filters -----------------------------------------------------------------------------

# (absent, present) for each optional filter.
_USER = ("$3::uuid IS NULL", "user_id = $3")
_MODEL = ("$4::uuid IS NULL", "model_id = $4")
_OUTCOME = ("$5::text IS NULL", "outcome = $5")
_UNITS = ("$6::text[] IS NULL", "business_unit = ANY($6::text[])")
_SEARCH = (" AND $7::text IS NULL",
           " AND (request_id = $7 OR model_name ILIKE '%' || $7 || '%' OR requested_model ILIKE '%' || $7 || '%')")
_REQUEST_ID = (" AND $8::text IS NULL", " AND request_id = $8")


def _filters(user: bool, model: bool, outcome: bool, units: bool) -> str:
    """The shared filter (time window excluded), over request_logs and the rollups alike."""
    return _USER[user] + " AND " + _MODEL[model] + " AND " + _OUTCOME[outcome] + " AND " + _UNITS[units]


def _row_filters(user: bool, model: bool, outcome: bool, units: bool, search: bool, request_id: bool) -> str:
    """The filter over request_logs rows: window, filters, search."""
    return ("created_at >= $1 AND created_at < $2 AND " + _filters(user, model, outcome, units) + _SEARCH[search]
            + _REQUEST_ID[request_id])


# The listing's sort keys and directions (a column or direction cannot be a parameter).
SORT_KEYS = {"created_at": "created_at", "latency_ms": "latency_ms", "cost": "(input_cost + output_cost)",
             "tokens": "(tokens_in + tokens_out)"}
_DIRECTIONS = {"asc": "asc", "desc": "desc"}


def _order_by(sort: str, order: str) -> str:
    direction = _DIRECTIONS[order]
    return " ORDER BY " + SORT_KEYS[sort] + " " + direction + ", request_id " + direction


# The rollup a view reads: one user's view (or a business unit's) needs the per-user rollup, which
# keeps the row's business unit; the instance's does not.
_ROLLUP = ("request_rollup_hourly_all", "request_rollup_hourly")

# --- listing -------------------------------------------------------------------------------

LIST_COLUMNS = (
    "id, request_id, created_at, user_id, mesh_key_id, provider_id, model_id, model_name, requested_model, route, "
    "outcome, deny_reason, status_code, latency_ms, ttfb_ms, tokens_in, tokens_out, cache_read_tokens, "
    "cache_write_tokens, usage_estimated, input_cost, output_cost, web_searches, source_ip, user_agent, browser, "
    "os, device_type, count, business_unit, manager_id, tier, would_deny, tags AS model_tags, call_tags AS tags, "
    "trace_id, tools_declared, "
    "tools_declared_bytes, tools_invoked, cache_write_1h_tokens, principal_kind, mesh_key_id AS key_id, token_issuer, "
    "token_subject, CASE WHEN principal_kind = 'application' THEN user_id END AS application_id, dlp, dlp_action"
)


def list_rows(user: bool, model: bool, outcome: bool, units: bool, search: bool, request_id: bool, sort: str,
              order: str) -> str:
    """A page of rows: the row parameters, then ``$9`` the page size, ``$10`` the offset."""
    return ("SELECT " + LIST_COLUMNS + " FROM request_logs WHERE "
            + _row_filters(user, model, outcome, units, search, request_id) + _order_by(sort, order)
            + " LIMIT $9 OFFSET $10")


def count_rows(user: bool, model: bool, outcome: bool, units: bool, search: bool, request_id: bool) -> str:
    """How many rows match (the row parameters)."""
    return "SELECT count(*) FROM request_logs WHERE " + _row_filters(user, model, outcome, units, search,
                                                                      request_id)


def count_window_rows(user: bool, model: bool, outcome: bool, units: bool) -> str:
    """How many rows match in ``$1``-``$2``, without search (``$3``-``$6``)."""
    return "SELECT count(*) FROM request_logs WHERE created_at >= $1 AND created_at < $2 AND " + _filters(
        user, model, outcome, units)


def count_rollup_rows(user: bool, model: bool, outcome: bool, units: bool) -> str:
    """The rows the rollup counted in the whole hours ``$1``-``$2`` (``$3``-``$6``)."""
    return ("SELECT coalesce(sum(rows), 0) FROM " + _ROLLUP[user or units] + " WHERE hour >= $1 AND hour < $2 AND "
            + _filters(user, model, outcome, units))


# --- summary -------------------------------------------------------------------------------

# One scan of the rollup answers every breakdown: the grouping sets, told apart by GROUPING().
# NOTE: SUMMARY's column lists are these, in this order.
SUMMARY_GROUPS = ("model_id", "provider_id", "outcome", "deny_reason", "bucket", "status_code")
_SUMMARY = """
SELECT model_id, provider_id, outcome, deny_reason, bucket, status_code,
       GROUPING(model_id, provider_id, outcome, deny_reason, bucket, status_code) AS grouping,
       min(model_name) AS model_name,
       coalesce(sum(calls), 0) AS calls, coalesce(sum(tokens_in), 0) AS tokens_in,
       coalesce(sum(tokens_out), 0) AS tokens_out, coalesce(sum(input_cost + output_cost), 0) AS cost,
       coalesce(sum(input_cost), 0) AS input_cost, coalesce(sum(output_cost), 0) AS output_cost,
       coalesce(sum(latency_ms), 0) AS latency_ms,
       coalesce(sum(cache_read_tokens), 0) AS cache_read_tokens,
       coalesce(sum(cache_write_tokens), 0) AS cache_write_tokens,
       coalesce(sum(cache_write_1h_tokens), 0) AS cache_write_1h_tokens,
       -- Mesh's error_calls: every answer with a status of 400 or more, denials included.
       coalesce(sum(calls) FILTER (WHERE status_code >= 400), 0) AS failed,
       coalesce(sum(calls) FILTER (WHERE outcome = 'upstream_error'), 0) AS errors,
       coalesce(sum(calls) FILTER (WHERE outcome = 'denied'), 0) AS denials,
       coalesce(sum(lat_100), 0) AS lat_100, coalesce(sum(lat_500), 0) AS lat_500,
       coalesce(sum(lat_1000), 0) AS lat_1000, coalesce(sum(lat_5000), 0) AS lat_5000,
       coalesce(sum(lat_30000), 0) AS lat_30000, coalesce(sum(lat_slower), 0) AS lat_slower
FROM r
GROUP BY GROUPING SETS ((), (model_id), (provider_id), (outcome), (deny_reason), (bucket), (status_code))
"""


def summary(user: bool, model: bool, outcome: bool, units: bool) -> str:
    """The summary's totals and breakdowns over whole hours ``$1``-``$2`` (``$3``-``$6``), its
    time series in buckets of ``$8`` ('hour' or 'day') in the time zone ``$7``."""
    return ("WITH r AS (SELECT *, date_trunc($8, hour AT TIME ZONE $7) AS bucket FROM " + _ROLLUP[user or units]
            + " WHERE hour >= $1 AND hour < $2 AND " + _filters(user, model, outcome, units) + ")" + _SUMMARY)


# Spend by person, from the hourly rollup (``$1``-``$2``, ``$3``-``$6``).
def spend_by_user_hourly(user: bool, model: bool, outcome: bool, units: bool) -> str:
    return ("SELECT user_id, sum(calls) AS calls, sum(tokens_in) AS tokens_in, sum(tokens_out) AS tokens_out, "
            "sum(input_cost + output_cost) AS cost FROM request_rollup_hourly WHERE hour >= $1 AND hour < $2 AND "
            + _filters(user, model, outcome, units) + " GROUP BY 1")


# Spend by person over whole days ``$1``-``$2`` (exclusive), of the outcome ``$3``.
SPEND_BY_USER_DAILY = ("""
SELECT user_id, sum(calls) AS calls, sum(tokens_in) AS tokens_in, sum(tokens_out) AS tokens_out,
       sum(input_cost + output_cost) AS cost
FROM request_rollup_daily_user WHERE day >= $1 AND day < $2 AND $3::text IS NULL GROUP BY 1
""", """
SELECT user_id, sum(calls) AS calls, sum(tokens_in) AS tokens_in, sum(tokens_out) AS tokens_out,
       sum(input_cost + output_cost) AS cost
FROM request_rollup_daily_user WHERE day >= $1 AND day < $2 AND outcome = $3 GROUP BY 1
""")

# group_by= of the summary: the row's own value at call time, as kept in request_rollup_hourly.
GROUP_KEYS = {"business_unit": "business_unit", "manager": "manager_id::text", "tier": "tier", "tag": "tag",
              "principal_kind": "principal_kind", "token_issuer": "token_issuer",
              "application_id": "CASE WHEN principal_kind = 'application' THEN user_id::text END"}
# Any other group_by is an attribution tag key (MESHFAST_TAG_KEYS), passed as ``$7``.
_TAG_KEY = "call_tags->>$7"
_GROUP_MEASURES = (
    "coalesce(sum(calls), 0) AS calls, coalesce(sum(calls) FILTER (WHERE outcome = 'denied'), 0) AS denied_calls, "
    "coalesce(sum(calls) FILTER (WHERE status_code >= 400), 0) AS error_calls, "
    "coalesce(sum(tokens_in), 0) AS tokens_in, coalesce(sum(tokens_out), 0) AS tokens_out, "
    "coalesce(sum(input_cost), 0) AS input_cost, coalesce(sum(output_cost), 0) AS output_cost")


def groups(group_by: str, user: bool, model: bool, outcome: bool, units: bool) -> str:
    """The window ``$1``-``$2`` (``$3``-``$6``) grouped by a built-in key (GROUP_KEYS) or, for
    any other ``group_by``, by the attribution tag ``$7``; grouped by ``tag``, once per model tag."""
    key = GROUP_KEYS.get(group_by, _TAG_KEY)
    source = "request_rollup_hourly CROSS JOIN LATERAL unnest(tags) AS t (tag)" if group_by == "tag" \
        else "request_rollup_hourly"
    return ("SELECT " + key + " AS key, " + _GROUP_MEASURES + " FROM " + source
            + " WHERE hour >= $1 AND hour < $2 AND " + _filters(user, model, outcome, units) + " GROUP BY 1")


# --- context signals (tool_rollup_hourly: ``$1``-``$2``, ``$3`` user, ``$4`` model) -------------

# The tool rollup keeps no business unit: a unit's view counts the people in the units ``$6`` now.
_TOOL_UNITS = ("$6::text[] IS NULL",
               "user_id IN (SELECT id FROM users WHERE business_unit = ANY($6::text[]))")


def tools(user: bool, model: bool, units: bool) -> str:
    """Per tool, declarations and invocations, the most declared first, at most ``$5``."""
    return ("SELECT tool, sum(declared_calls) AS declared, sum(invoked_calls) AS invoked, "
            "sum(definition_bytes) AS bytes FROM tool_rollup_hourly "
            "WHERE hour >= $1 AND hour < $2 AND " + _USER[user] + " AND " + _MODEL[model] + " AND "
            + _TOOL_UNITS[units] + " GROUP BY tool "
            "ORDER BY sum(declared_calls) DESC, sum(invoked_calls) DESC, tool LIMIT $5")


def unused_tools(user: bool, model: bool) -> str:
    """Per person, the tools declared and never called."""
    return ("SELECT user_id, tool, sum(declared_calls) AS declared, sum(definition_bytes) AS bytes "
            "FROM tool_rollup_hourly WHERE hour >= $1 AND hour < $2 AND " + _USER[user] + " AND " + _MODEL[model]
            + " GROUP BY user_id, tool HAVING sum(invoked_calls) = 0 AND sum(declared_calls) > 0")


# --- people --------------------------------------------------------------------------------

# An application has no email: it shows as "application: <name>".
EMAILS = """
SELECT id::text AS id, COALESCE(email, 'application: ' || display_name) AS email FROM users WHERE id = ANY($1::uuid[])
"""

# --- audit log (``$1`` actor, ``$2`` action, ``$3``-``$4`` the window, ``$5`` business units,
# each optional) ---------------------------------------------------------------------------------

_ACTOR = ("$1::text IS NULL", "actor = $1")
_ACTION = ("$2::text IS NULL", "action = $2")
_SINCE = ("$3::timestamptz IS NULL", "created_at >= $3")
_UNTIL = ("$4::timestamptz IS NULL", "created_at < $4")
_AUDIT_UNITS = ("$5::text[] IS NULL", "business_unit = ANY($5::text[])")


def _audit_filters(actor: bool, action: bool, since: bool, until: bool, units: bool) -> str:
    return (_ACTOR[actor] + " AND " + _ACTION[action] + " AND " + _SINCE[since] + " AND " + _UNTIL[until]
            + " AND " + _AUDIT_UNITS[units])


def audit(actor: bool, action: bool, since: bool, until: bool, units: bool) -> str:
    """A page of the audit log, newest first: ``$6`` the page size, ``$7`` the offset."""
    return ("SELECT id, actor, action, target, detail, business_unit, created_at FROM admin_audit_log WHERE "
            + _audit_filters(actor, action, since, until, units)
            + " ORDER BY created_at DESC, id DESC LIMIT $6 OFFSET $7")


def count_audit(actor: bool, action: bool, since: bool, until: bool, units: bool) -> str:
    return "SELECT count(*) FROM admin_audit_log WHERE " + _audit_filters(actor, action, since, until, units)


# --- CSV export ----------------------------------------------------------------------------

# The export's columns as the rows hold them, in meshfast.admin.logs.EXPORT_HEADER's order
# (user_email, looked up apart, left out).
EXPORT_COLUMNS = (
    "id, request_id, created_at, user_id, business_unit, manager_id, tier, model_id, model_name, requested_model, "
    "provider_id, route, outcome, deny_reason, would_deny, status_code, latency_ms, tokens_in, tokens_out, "
    "cache_read_tokens, cache_write_tokens, count, input_cost, output_cost, (input_cost + output_cost) AS cost, "
    "tags AS model_tags, source_ip, user_agent, cache_write_1h_tokens, tools_declared, tools_invoked, "
    "call_tags AS tags, principal_kind, mesh_key_id AS key_id, token_issuer, token_subject, "
    "CASE WHEN principal_kind = 'application' THEN user_id END AS application_id, dlp, dlp_action"
)
# Past the keyset position (``$10`` created_at, ``$11`` request_id) in the export's direction.
_AFTER = {"desc": " AND created_at <= $10 AND (created_at, request_id) < ($10, $11)",
          "asc": " AND created_at >= $10 AND (created_at, request_id) > ($10, $11)"}


def export_page(user: bool, model: bool, outcome: bool, units: bool, search: bool, request_id: bool, order: str,
                first: bool) -> str:
    """A page of the export by keyset (``created_at``, ``request_id``): the row parameters, ``$9``
    the page size; a page after the first also ``$10``, ``$11`` (the previous page's last row)."""
    return ("SELECT " + EXPORT_COLUMNS + " FROM request_logs WHERE "
            + _row_filters(user, model, outcome, units, search, request_id) + ("" if first else _AFTER[order])
            + _order_by("created_at", order) + " LIMIT $9")
