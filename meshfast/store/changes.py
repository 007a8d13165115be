"""Governed changes' SQL: the approval queue (``changes``), the revisions of controls
(``control_revisions``), the controls' current state as the lifecycle reads it, and business units'
timezones, as named constants with ``$n`` parameters."""

# --- business units' timezones (local-midnight activation) ---------------------------------

UNIT_TIMEZONES = "SELECT name, timezone FROM business_units WHERE name = ANY($1::text[])"

# --- audit (with the unit the record concerns) -----------------------------------------------

INSERT_AUDIT_UNIT = """
INSERT INTO admin_audit_log (actor, action, target, detail, business_unit) VALUES ($1, $2, $3, $4::jsonb, $5)
"""

# --- the queue -------------------------------------------------------------------------------

INSERT_CHANGE = """
INSERT INTO changes (kind, target, action, body, base_version, digest, requested_by, requested_by_id,
    requested_by_admin_id, business_unit, activate_at, expires_at)
VALUES ($1, $2, $3, $4::jsonb, $5, $6, $7, $8, $9, $10, $11, now() + make_interval(secs => $12))
RETURNING id, kind, target, action, body, base_version, digest, status, requested_by, requested_by_id,
    requested_by_admin_id, business_unit, activate_at, comment, decided_by, created_at, decided_at, expires_at
"""
# The requester's pending change of the same control: a new submission edits it (new digest).
PENDING_CHANGE_OF = """
SELECT id FROM changes
WHERE kind = $1 AND target = $2 AND requested_by_id = $3 AND status = 'pending'
ORDER BY created_at DESC LIMIT 1 FOR UPDATE
"""
REVISE_CHANGE = """
UPDATE changes SET action = $2, body = $3::jsonb, base_version = $4, digest = $5, activate_at = $6,
    business_unit = $7, created_at = now(), expires_at = now() + make_interval(secs => $8)
WHERE id = $1
RETURNING id, kind, target, action, body, base_version, digest, status, requested_by, requested_by_id,
    requested_by_admin_id, business_unit, activate_at, comment, decided_by, created_at, decided_at, expires_at
"""
# The requester's pending changes of a control it has since written with effect: superseded.
SUPERSEDE_PENDING = """
UPDATE changes SET status = 'superseded', decided_at = now()
WHERE kind = $1 AND target = $2 AND requested_by_id = $3 AND status = 'pending'
RETURNING id
"""
GET_CHANGE = """
SELECT id, kind, target, action, body, base_version, digest, status, requested_by, requested_by_id,
    requested_by_admin_id, business_unit, activate_at, comment, decided_by, created_at, decided_at, expires_at
FROM changes WHERE id = $1
"""
CHANGE_FOR_UPDATE = """
SELECT id, kind, target, action, body, base_version, digest, status, requested_by, requested_by_id,
    requested_by_admin_id, business_unit, activate_at, comment, decided_by, created_at, decided_at, expires_at,
    expires_at <= now() AS expired
FROM changes WHERE id = $1 FOR UPDATE
"""
DECIDE_CHANGE = """
UPDATE changes SET status = $2, decided_by = $3, comment = COALESCE($4, comment), decided_at = now()
WHERE id = $1
RETURNING id, kind, target, action, body, base_version, digest, status, requested_by, requested_by_id,
    requested_by_admin_id, business_unit, activate_at, comment, decided_by, created_at, decided_at, expires_at
"""
# Filters: $1 status (NULL: any), $2 the caller's units (NULL: every change), $3 limit, $4 offset.
LIST_CHANGES = """
SELECT id, kind, target, action, body, base_version, digest, status, requested_by, requested_by_id,
    requested_by_admin_id, business_unit, activate_at, comment, decided_by, created_at, decided_at, expires_at
FROM changes
WHERE ($1::text IS NULL OR status = $1) AND ($2::text[] IS NULL OR business_unit = ANY($2))
ORDER BY created_at DESC, id LIMIT $3 OFFSET $4
"""
COUNT_CHANGES = """
SELECT count(*) FROM changes
WHERE ($1::text IS NULL OR status = $1) AND ($2::text[] IS NULL OR business_unit = ANY($2))
"""
EXPIRE_CHANGES = """
UPDATE changes SET status = 'expired', decided_at = now()
WHERE id IN (SELECT id FROM changes WHERE status = 'pending' AND expires_at <= now()
             ORDER BY expires_at LIMIT 100 FOR UPDATE SKIP LOCKED)
RETURNING id, kind, target, action, body, base_version, digest, status, requested_by, requested_by_id,
    requested_by_admin_id, business_unit, activate_at, comment, decided_by, created_at, decided_at, expires_at
"""

# --- revisions -------------------------------------------------------------------------------

NEXT_REVISION = """
SELECT COALESCE(max(revision), 0) + 1 FROM control_revisions WHERE kind = $1 AND target = $2
"""
INSERT_REVISION = """
INSERT INTO control_revisions (kind, target, revision, action, body, status, activate_at, change_id, created_by,
    enforced_at)
VALUES ($1, $2, $3, $4, $5::jsonb, $6, $7, $8, $9, CASE WHEN $6 = 'enforced' THEN now() END)
"""
# Revisions still waiting for their time when a newer one is accepted: superseded (the newest
# saved revision is the intent; an older schedule never lands on top of it).
SUPERSEDE_SCHEDULED = """
UPDATE control_revisions SET status = 'superseded' WHERE kind = $1 AND target = $2 AND status = 'scheduled'
"""
# The enforced revision before a new one is enforced: superseded.
SUPERSEDE_ENFORCED = """
UPDATE control_revisions SET status = 'superseded' WHERE kind = $1 AND target = $2 AND status = 'enforced'
"""
DUE_REVISIONS = """
SELECT kind, target, revision, action, body, change_id, created_by FROM control_revisions
WHERE status = 'scheduled' AND activate_at <= now()
ORDER BY activate_at, revision LIMIT 1 FOR UPDATE SKIP LOCKED
"""
ENFORCE_REVISION = """
UPDATE control_revisions SET status = 'enforced', enforced_at = now(), error = NULL
WHERE kind = $1 AND target = $2 AND revision = $3
"""
FAIL_REVISION = """
UPDATE control_revisions SET status = 'failed', error = $4 WHERE kind = $1 AND target = $2 AND revision = $3
"""
# Per target of one kind: the newest accepted revision (scheduled included), the enforced one,
# the next scheduled one and the error of a failed activation newer than the enforced revision.
REVISION_STATES = """
SELECT target,
       max(revision) FILTER (WHERE status IN ('scheduled', 'enforced', 'superseded')) AS saved_revision,
       max(revision) FILTER (WHERE status = 'enforced') AS enforced_revision,
       (array_agg(revision ORDER BY activate_at, revision) FILTER (WHERE status = 'scheduled'))[1]
           AS scheduled_revision,
       (array_agg(activate_at ORDER BY activate_at, revision) FILTER (WHERE status = 'scheduled'))[1]
           AS scheduled_at,
       (array_agg(revision ORDER BY revision DESC) FILTER (WHERE status = 'failed'))[1] AS failed_revision,
       (array_agg(error ORDER BY revision DESC) FILTER (WHERE status = 'failed'))[1] AS failed_error
FROM control_revisions
WHERE kind = $1 AND target = ANY($2::text[])
GROUP BY target
"""

# --- the controls' state as the lifecycle reads it --------------------------------------------

RULE_BODY = "SELECT body FROM rules WHERE id = $1"
MODEL_RESTRICTIONS = "SELECT restrictions FROM models WHERE id = $1"
GET_POLICY = """
SELECT daily_cap_usd, max_calls_per_hour, allowed_from, allowed_to, timezone, active_days, always_open
FROM user_model_policies WHERE user_id = $1 AND model_id = $2
"""
PRINCIPAL_UNIT = "SELECT business_unit FROM users WHERE id = $1"
# An approved change whose scheduled revision went live (applied) or failed its activation.
SETTLE_CHANGE = "UPDATE changes SET status = $2 WHERE id = $1 AND status = 'approved'"
