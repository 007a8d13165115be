"""Admin login through an OIDC issuer (meshfast.admin.oidc): login attempts, the admin an ID
token names, and that admin's business units, as named constants with ``$n`` parameters."""

# --- login attempts (migration 0028) ---------------------------------------------------------

# A new attempt ($1 the state's hash, $2 the nonce, $3 the redirect URI, $4 its lifetime, $6 the
# source it was begun from), unless $5 attempts from that source are pending already (then no row:
# the caller refuses). Expired attempts go first, so the pending ones alone count against the cap.
INSERT_ATTEMPT = """
WITH swept AS (DELETE FROM admin_oidc_attempts WHERE expires_at <= now())
INSERT INTO admin_oidc_attempts (state_hash, nonce, redirect_uri, expires_at, source)
SELECT $1, $2, $3, now() + $4::interval, $6
WHERE (SELECT count(*) FROM admin_oidc_attempts WHERE source = $6 AND expires_at > now()) < $5
RETURNING true
"""
# Past $1 pending attempts in all, the oldest go (their logins fail as expired ones do), so a table
# filled from many sources still takes new logins.
EVICT_ATTEMPTS = """
DELETE FROM admin_oidc_attempts WHERE state_hash IN (
    SELECT state_hash FROM admin_oidc_attempts ORDER BY created_at DESC OFFSET $1
)
"""
# Single use: the one statement that finds an attempt also deletes it, so of two callbacks with
# the same state only one gets the row.
CONSUME_ATTEMPT = """
DELETE FROM admin_oidc_attempts WHERE state_hash = $1 RETURNING nonce, redirect_uri, expires_at > now() AS live
"""

# --- the admin ---------------------------------------------------------------------------------

# The admin of an email ($1), held for the login's transaction: its OIDC identity, whether it is a
# platform administrator now and whether the issuer provisioned it or logged it in before.
ADMIN_FOR_LOGIN = """
SELECT id, is_super, oidc_issuer, oidc_subject, (created_by = 'oidc' OR oidc_subject IS NOT NULL) AS from_oidc
FROM admins WHERE email = $1 FOR UPDATE
"""
# The admin an ID token names ($1 email), created when new (with $2, a password hash that verifies
# no password) or updated to the role the issuer gives ($3 is_super; $5 a unit role), bound to the
# issuer's subject ($6 issuer, $7 subject) at its first OIDC login. A paused admin is left as it is
# and returns no row. ``created``: the row is new (an insert leaves xmax 0).
UPSERT_OIDC_ADMIN = """
INSERT INTO admins (email, password_hash, is_super, created_by, unit_admin, oidc_issuer, oidc_subject)
VALUES ($1, $2, $3, $4, $5, $6, $7)
ON CONFLICT (email) DO UPDATE SET is_super = EXCLUDED.is_super,
    unit_admin = admins.unit_admin OR EXCLUDED.unit_admin,
    oidc_issuer = coalesce(admins.oidc_issuer, EXCLUDED.oidc_issuer),
    oidc_subject = coalesce(admins.oidc_subject, EXCLUDED.oidc_subject)
WHERE admins.status = 'active'
RETURNING id, is_super, (xmax = 0) AS created
"""
# An OIDC admin the issuer no longer gives a role ($1): no platform rights, no unit (scoped to none
# from now on, migration 0031).
STRIP_ADMIN = """
WITH units AS (DELETE FROM business_unit_admins WHERE admin_id = $1)
UPDATE admins SET is_super = false, unit_admin = true WHERE id = $1
"""
# A demoted admin's sessions end and its platform tokens are revoked ($1), in the login's transaction.
END_ADMIN_SESSIONS = "DELETE FROM admin_sessions WHERE admin_id = $1"
REVOKE_SUPER_TOKENS = """
UPDATE admin_tokens SET revoked_at = now() WHERE owner_admin_id = $1 AND is_super AND revoked_at IS NULL
"""
# The business units among the names $1, by name.
UNITS_NAMED = "SELECT id, name FROM business_units WHERE name = ANY($1::text[]) ORDER BY name"
# The admin $1 administers exactly the units $2 (ids): others are removed, missing ones added.
SET_ADMIN_UNITS = """
WITH removed AS (
    DELETE FROM business_unit_admins WHERE admin_id = $1 AND NOT (business_unit_id = ANY($2::uuid[]))
)
INSERT INTO business_unit_admins (business_unit_id, admin_id)
SELECT unit, $1 FROM unnest($2::uuid[]) AS unit
ON CONFLICT DO NOTHING
"""
