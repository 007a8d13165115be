"""Notifications' SQL: the settings row, the deliveries list and the ``rule_events`` outbox the
leader delivers (meshfast/notify.py), as named constants with ``$n`` parameters."""

# --- settings (one row) ----------------------------------------------------------------------

ENSURE_SETTINGS_ROW = "INSERT INTO notification_settings (id) VALUES (true) ON CONFLICT DO NOTHING"
SETTINGS_FOR_UPDATE = "SELECT * FROM notification_settings WHERE id FOR UPDATE"
SELECT_SETTINGS = "SELECT * FROM notification_settings WHERE id"
UPDATE_SETTINGS = """
UPDATE notification_settings SET
    webhook_url = $1, webhook_local = $2, webhook_secret_sealed = $3, webhook_secret_nonce = $4,
    smtp_host = $5, smtp_port = $6, smtp_from = $7, smtp_username = $8,
    smtp_password_sealed = $9, smtp_password_nonce = $10, smtp_starttls = $11,
    version = version + 1, updated_at = now()
WHERE id
RETURNING *
"""

# --- deliveries (the admin's list) -----------------------------------------------------------

# Notifications and digests (pauses are rule_events too, but not deliveries), newest first; each
# filter ($1 status, $2 channel, $3 rule, $4 person, $5 action) applies when it is not NULL.
# NOTE: LIST_DELIVERIES and COUNT_DELIVERIES share the same WHERE clause.
LIST_DELIVERIES = """
SELECT delivery_id, rule_id, entry, user_id, action, channel, "window", window_start, threshold_nano,
       spend_nano, status, attempts, next_attempt_at, last_error, created_at, delivered_at
FROM rule_events
WHERE action <> 'pause'
  AND ($1::text IS NULL OR status = $1) AND ($2::text IS NULL OR channel = $2)
  AND ($3::text IS NULL OR rule_id = $3) AND ($4::uuid IS NULL OR user_id = $4)
  AND ($5::text IS NULL OR action = $5)
ORDER BY id DESC
LIMIT $6 OFFSET $7
"""
COUNT_DELIVERIES = """
SELECT count(*) FROM rule_events
WHERE action <> 'pause'
  AND ($1::text IS NULL OR status = $1) AND ($2::text IS NULL OR channel = $2)
  AND ($3::text IS NULL OR rule_id = $3) AND ($4::uuid IS NULL OR user_id = $4)
  AND ($5::text IS NULL OR action = $5)
"""

# --- the outbox (the leader's notify job) ----------------------------------------------------

# Due deliverable rows (pending notifies and digests), claimed: the attempt counted and the next
# attempt moved $2 s ahead (the lease), at most $1 rows.
CLAIM_DUE = """
WITH due AS (
    SELECT id FROM rule_events
    WHERE status = 'pending' AND action IN ('notify', 'digest') AND next_attempt_at <= now()
    ORDER BY next_attempt_at, id
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
UPDATE rule_events e
SET attempts = e.attempts + 1, next_attempt_at = now() + make_interval(secs => $2)
FROM due
WHERE e.id = due.id
RETURNING e.id, e.delivery_id, e.rule_id, e.entry, e.user_id, e.action, e.channel, e."window",
          e.window_start, e.threshold_nano, e.spend_nano, e.detail::text AS detail, e.attempts, e.created_at
"""
# An application's notices go to its owner.
RECIPIENTS = """
SELECT u.id, COALESCE(u.email, o.email) AS email, u.display_name, u.business_unit
FROM users u LEFT JOIN users o ON o.id = u.owner_id WHERE u.id = ANY($1::uuid[])
"""
MARK_DELIVERED = """
UPDATE rule_events SET status = 'delivered', delivered_at = now(), last_error = NULL
WHERE id = $1 AND status = 'pending'
"""
MARK_SKIPPED = "UPDATE rule_events SET status = 'skipped', last_error = $2 WHERE id = $1 AND status = 'pending'"
# A failed attempt: retried at now + $3 s, or failed for good once the row is $4 s old.
MARK_FAILURE = """
UPDATE rule_events SET
    status = CASE WHEN now() - created_at >= make_interval(secs => $4) THEN 'failed' ELSE 'pending' END,
    next_attempt_at = now() + make_interval(secs => $3),
    last_error = $5
WHERE id = $1 AND attempts = $2 AND status = 'pending'
RETURNING status
"""
RELEASE = """
UPDATE rule_events SET next_attempt_at = now(), attempts = greatest(attempts - 1, 0)
WHERE id = ANY($1::bigint[]) AND status = 'pending'
"""
# Window instances with crossings that ended between $2 and $3 s ago. A window instance ends, in
# the calendar's zone ($1), a day, a week or a calendar month after it starts.
ENDED_INSTANCES = """
SELECT DISTINCT "window", window_start FROM rule_events
WHERE action = 'notify'
  AND window_start >= now() - make_interval(secs => $2) - interval '32 days'
  AND ((window_start AT TIME ZONE $1::text) + CASE "window" WHEN 'daily' THEN interval '1 day'
    WHEN 'weekly' THEN interval '7 days' ELSE interval '1 month' END) AT TIME ZONE $1::text
      BETWEEN now() - make_interval(secs => $2) AND now() - make_interval(secs => $3)
"""
# One window instance ($1, $2): each leader above someone who crossed a notify threshold in it gets
# a digest row per channel ($3), listing those people (the chain walked up from them, at most $4
# levels, so the cost follows the people who crossed, not the size of the organisation).
MAKE_DIGESTS = """
WITH RECURSIVE crossed AS (
    SELECT user_id, rule_id, entry, threshold_nano, max(spend_nano) AS spend_nano
    FROM rule_events
    WHERE action = 'notify' AND "window" = $1 AND window_start = $2
    GROUP BY 1, 2, 3, 4
),
chain (member_id, leader_id, depth) AS (
    SELECT c.user_id, u.manager_id, 1
    FROM (SELECT DISTINCT user_id FROM crossed) c JOIN users u ON u.id = c.user_id
    WHERE u.manager_id IS NOT NULL
    UNION
    SELECT ch.member_id, u.manager_id, ch.depth + 1
    FROM chain ch JOIN users u ON u.id = ch.leader_id
    WHERE u.manager_id IS NOT NULL AND ch.depth < $4::int
),
digests AS (
    SELECT l.leader_id, jsonb_build_object('people', jsonb_agg(jsonb_build_object(
               'user_id', c.user_id, 'email', p.email, 'person', p.display_name,
               'business_unit', p.business_unit, 'rule_id', c.rule_id, 'entry', c.entry,
               'threshold_nano', c.threshold_nano, 'spend_nano', c.spend_nano)
           ORDER BY p.email, c.rule_id, c.entry, c.threshold_nano)) AS detail
    FROM crossed c
    JOIN (SELECT DISTINCT member_id, leader_id FROM chain) l ON l.member_id = c.user_id
    LEFT JOIN users p ON p.id = c.user_id
    WHERE l.leader_id <> c.user_id
    GROUP BY l.leader_id
)
INSERT INTO rule_events (rule_id, entry, user_id, action, channel, "window", window_start,
                         threshold_nano, spend_nano, detail)
SELECT '*', -1, d.leader_id, 'digest', ch.channel, $1, $2, 0, 0, d.detail
FROM digests d CROSS JOIN unnest($3::text[]) AS ch (channel)
ON CONFLICT DO NOTHING
"""
