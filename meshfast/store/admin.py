"""The admin plane's own SQL (admins, sessions, admin tokens, idempotency keys), as named
constants with ``$n`` parameters."""

# --- login -----------------------------------------------------------------------------------

# One atomic step per login attempt, before its password is checked: count the attempt and, at the
# LOCK_AFTER-th ($2), lock the account for $3. A correct password then resets both
# (LOGIN_SUCCEEDED), so the counter holds the failures since the last success, as in Mesh, and
# concurrent attempts past the LOCK_AFTER-th are refused as locked without a password check. No
# row: locked, paused or unknown.
CLAIM_ATTEMPT = """
UPDATE admins SET failed_login_attempts = failed_login_attempts + 1,
    locked_until = CASE WHEN failed_login_attempts + 1 >= $2 THEN now() + $3::interval ELSE locked_until END
WHERE email = $1 AND status = 'active' AND (locked_until IS NULL OR locked_until <= now())
RETURNING id, password_hash, failed_login_attempts
"""
IS_LOCKED = """
SELECT locked_until > now() FROM admins WHERE email = $1 AND status = 'active'
"""
LOGIN_SUCCEEDED = """
UPDATE admins SET failed_login_attempts = 0, locked_until = NULL WHERE id = $1 AND status = 'active'
RETURNING is_super
"""

# --- sessions --------------------------------------------------------------------------------

INSERT_SESSION = """
INSERT INTO admin_sessions (admin_id, token_hash, csrf_hash, expires_at) VALUES ($1, $2, $3, now() + $4::interval)
"""
# ``units``: the business units the admin administers (empty for none), read with the session so a
# unit's administrators are scoped from the next request after a change, as a logout would be.
SESSION_BY_HASH = """
SELECT a.id, a.email, a.is_super, s.csrf_hash,
       ARRAY(SELECT b.name FROM business_unit_admins ba JOIN business_units b ON b.id = ba.business_unit_id
             WHERE ba.admin_id = a.id ORDER BY b.name) AS units
FROM admin_sessions s JOIN admins a ON a.id = s.admin_id
WHERE s.token_hash = $1 AND s.expires_at > now() AND a.status = 'active'
"""
DELETE_SESSION = "DELETE FROM admin_sessions WHERE token_hash = $1"
# Every session of an admin but the one ($2) that changed the password.
DELETE_OTHER_SESSIONS = "DELETE FROM admin_sessions WHERE admin_id = $1 AND token_hash <> $2"
DELETE_ADMIN_SESSIONS = "DELETE FROM admin_sessions WHERE admin_id = $1::uuid"
DELETE_EXPIRED_SESSIONS = "DELETE FROM admin_sessions WHERE expires_at <= now()"

# --- admins ----------------------------------------------------------------------------------

PASSWORD_HASH = "SELECT password_hash FROM admins WHERE id = $1"
SET_PASSWORD_HASH = "UPDATE admins SET password_hash = $2 WHERE id = $1"
INSERT_ADMIN = """
INSERT INTO admins (email, password_hash, is_super, created_by) VALUES ($1, $2, $3, $4)
RETURNING id, email, status, is_super, created_by, created_at
"""
LIST_ADMINS = "SELECT id, email, status, is_super, created_by, created_at FROM admins ORDER BY created_at DESC"
DELETE_ADMIN = "DELETE FROM admins WHERE id = $1::uuid RETURNING email"
SET_ADMIN_STATUS = "UPDATE admins SET status = $2 WHERE id = $1::uuid RETURNING email"

# --- admin API tokens ------------------------------------------------------------------------

# A token is refused while the admin it answers to (owner_admin_id, see migration 0012) is paused or
# once they are deleted.
# ``business_units``: the token's own scope (NULL: none); ``owner_units``: the units its admin
# administers now (empty for none), so a unit administrator's token never reaches past them.
TOKEN_BY_HASH = """
SELECT t.id, t.name, t.is_super, t.owner_admin_id, t.business_units, coalesce(a.is_super, false) AS owner_is_super,
       ARRAY(SELECT b.name FROM business_unit_admins ba JOIN business_units b ON b.id = ba.business_unit_id
             WHERE ba.admin_id = t.owner_admin_id ORDER BY b.name) AS owner_units
FROM admin_tokens t LEFT JOIN admins a ON a.id = t.owner_admin_id
WHERE t.token_hash = $1 AND t.revoked_at IS NULL AND (t.owner_admin_id IS NULL OR a.status = 'active')
"""
TOKEN_FOR_REVOKE = """
SELECT id, name, is_super, owner_admin_id FROM admin_tokens
WHERE id = $1::uuid AND revoked_at IS NULL FOR UPDATE
"""
REVOKE_TOKEN = "UPDATE admin_tokens SET revoked_at = now() WHERE id = $1::uuid"
INSERT_TOKEN = """
INSERT INTO admin_tokens (name, token_hash, is_super, created_by, owner_admin_id, business_units)
VALUES ($1, $2, $3, $4, $5::uuid, $6::text[])
RETURNING id, name, is_super, created_by, created_at, owner_admin_id, business_units
"""
LIST_TOKENS = """
SELECT id, name, is_super, created_by, created_at, revoked_at, owner_admin_id, business_units FROM admin_tokens
ORDER BY created_at DESC
"""

# --- idempotency keys ------------------------------------------------------------------------

# True when this request is the first under (actor, key); nothing when one claimed it before.
CLAIM_IDEMPOTENCY_KEY = """
INSERT INTO admin_idempotency (actor, key, request_hash) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING RETURNING true
"""
IDEMPOTENCY_KEY = "SELECT request_hash, status, response FROM admin_idempotency WHERE actor = $1 AND key = $2"
RELEASE_IDEMPOTENCY_KEY = "DELETE FROM admin_idempotency WHERE actor = $1 AND key = $2"
KEEP_IDEMPOTENT_REPLY = """
UPDATE admin_idempotency SET status = $3, response = $4::jsonb WHERE actor = $1 AND key = $2
"""

# --- the admin's own user --------------------------------------------------------------------

USER_BY_EMAIL = "SELECT id, email, status FROM users WHERE email = $1"
