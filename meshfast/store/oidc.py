"""Admin login through an OIDC issuer (meshfast.admin.oidc): login attempts, the admin an ID
token names, and that admin's business units, as named constants with ``$n`` parameters."""

# --- login attempts (migration 0028) ---------------------------------------------------------

# A new attempt ($1 the state's hash, $2 the nonce, $3 the redirect URI, $4 its lifetime), unless
# $5 attempts are pending already (then no row: the caller refuses). Expired attempts go first,
# so the pending ones alone count against the cap.
INSERT_ATTEMPT = """
WITH swept AS (DELETE FROM admin_oidc_attempts WHERE expires_at <= now())
INSERT INTO admin_oidc_attempts (state_hash, nonce, redirect_uri, expires_at)
SELECT $1, $2, $3, now() + $4::interval
WHERE (SELECT count(*) FROM admin_oidc_attempts WHERE expires_at > now()) < $5
RETURNING true
"""
# Single use: the one statement that finds an attempt also deletes it, so of two callbacks with
# the same state only one gets the row.
CONSUME_ATTEMPT = """
DELETE FROM admin_oidc_attempts WHERE state_hash = $1 RETURNING nonce, redirect_uri, expires_at > now() AS live
"""

# --- the admin ---------------------------------------------------------------------------------

# The admin an ID token names ($1 email), created when new (with $2, a password hash that verifies
# no password) or updated to the role the issuer gives ($3 is_super). A paused admin is left as it
# is and returns no row. ``created``: the row is new (an insert leaves xmax 0).
UPSERT_OIDC_ADMIN = """
INSERT INTO admins (email, password_hash, is_super, created_by) VALUES ($1, $2, $3, $4)
ON CONFLICT (email) DO UPDATE SET is_super = EXCLUDED.is_super WHERE admins.status = 'active'
RETURNING id, is_super, (xmax = 0) AS created
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
