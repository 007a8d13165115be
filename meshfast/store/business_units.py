"""Business units and their administrators (meshfast/admin/business_units.py), as named
constants with ``$n`` parameters."""

LIST_UNITS = """
SELECT b.id, b.name, b.timezone, b.daily_cap_lock_usd, b.version, b.created_at, b.updated_at,
    ARRAY(SELECT ba.admin_id::text FROM business_unit_admins ba WHERE ba.business_unit_id = b.id
          ORDER BY ba.admin_id) AS admins
FROM business_units b ORDER BY b.name
"""
GET_UNIT = """
SELECT b.id, b.name, b.timezone, b.daily_cap_lock_usd, b.version, b.created_at, b.updated_at,
    ARRAY(SELECT ba.admin_id::text FROM business_unit_admins ba WHERE ba.business_unit_id = b.id
          ORDER BY ba.admin_id) AS admins
FROM business_units b WHERE b.id = $1
"""
UNIT_FOR_UPDATE = "SELECT id, name, version FROM business_units WHERE id = $1 FOR UPDATE"
INSERT_UNIT = """
INSERT INTO business_units (name, timezone, daily_cap_lock_usd) VALUES ($1, $2, $3) RETURNING id
"""
UPDATE_UNIT = """
UPDATE business_units SET name = $2, timezone = $3, daily_cap_lock_usd = $4, version = version + 1, updated_at = now()
WHERE id = $1
"""
CLEAR_UNIT_ADMINS = "DELETE FROM business_unit_admins WHERE business_unit_id = $1"
# Listed once, an admin is a business-unit administrator for good (migration 0031).
ADD_UNIT_ADMINS = """
WITH marked AS (UPDATE admins SET unit_admin = true WHERE id = ANY($2::uuid[]) AND NOT unit_admin)
INSERT INTO business_unit_admins (business_unit_id, admin_id) SELECT $1, unnest($2::uuid[])
"""
# Admin tokens scoped to a renamed unit follow the new name (units are named in their scope).
RENAME_IN_TOKENS = """
UPDATE admin_tokens SET business_units = array_replace(business_units, $1, $2) WHERE $1 = ANY(business_units)
"""

# A renamed unit's people ($1 the old name, $2 the new) keep their unit: their labels follow it.
RENAME_IN_USERS = """
UPDATE users SET business_unit = $2, version = version + 1, updated_at = now() WHERE business_unit = $1
"""
# Models closed or opened for the renamed unit stay so.
RENAME_IN_RESTRICTIONS = """
UPDATE models SET version = version + 1, restrictions = restrictions || (
    SELECT coalesce(jsonb_object_agg(field, (
        SELECT jsonb_agg(CASE WHEN u = to_jsonb($1::text) THEN to_jsonb($2::text) ELSE u END ORDER BY n)
        FROM jsonb_array_elements(restrictions -> field) WITH ORDINALITY AS listed (u, n))), '{}'::jsonb)
    FROM unnest(ARRAY['business_units_closed', 'business_units_open']) AS field
    WHERE jsonb_typeof(restrictions -> field) = 'array' AND restrictions -> field ? $1
)
WHERE restrictions -> 'business_units_closed' ? $1 OR restrictions -> 'business_units_open' ? $1
"""
# Rules whose entries name the renamed unit in population.business_units keep reaching it.
RENAME_IN_RULES = """
UPDATE rules SET version = version + 1, updated_at = now(), body = jsonb_set(body, '{entries}', (
    SELECT jsonb_agg(CASE WHEN jsonb_typeof(e -> 'population' -> 'business_units') = 'array'
                               AND e -> 'population' -> 'business_units' ? $1
        THEN jsonb_set(e, '{population,business_units}', (
            SELECT jsonb_agg(CASE WHEN u = to_jsonb($1::text) THEN to_jsonb($2::text) ELSE u END ORDER BY n)
            FROM jsonb_array_elements(e -> 'population' -> 'business_units') WITH ORDINALITY AS listed (u, n)))
        ELSE e END ORDER BY i)
    FROM jsonb_array_elements(body -> 'entries') WITH ORDINALITY AS entry (e, i)))
WHERE jsonb_typeof(body -> 'entries') = 'array' AND EXISTS (
    SELECT 1 FROM jsonb_array_elements(body -> 'entries') AS e
    WHERE jsonb_typeof(e -> 'population' -> 'business_units') = 'array' AND e -> 'population' -> 'business_units' ? $1)
"""

# Those of the ids ``$1`` that name admins, and whether each is a platform administrator.
ADMINS_BY_IDS = "SELECT id::text AS id, is_super FROM admins WHERE id = ANY($1::uuid[])"
# A registry file's units: one by name (for update), and admins by email ($1: emails).
UNIT_BY_NAME = """
SELECT b.id, b.name, b.timezone, b.daily_cap_lock_usd, b.version,
       ARRAY(SELECT ba.admin_id FROM business_unit_admins ba WHERE ba.business_unit_id = b.id
             ORDER BY ba.admin_id) AS admins
FROM business_units b WHERE b.name = $1 FOR UPDATE
"""
ADMINS_BY_EMAILS = "SELECT id, email, is_super FROM admins WHERE email = ANY($1::text[])"
# The units of the names ``$1`` that exist, with their locks.
UNITS_BY_NAMES = "SELECT name, daily_cap_lock_usd FROM business_units WHERE name = ANY($1::text[])"

# --- what a scope check reads ---------------------------------------------------------------

# A person's (or application's) business unit; no row: no such principal.
PRINCIPAL_UNIT = "SELECT business_unit FROM users WHERE id = $1"
# The same in a write's transaction, held to its commit: the unit cannot change under the write.
LOCK_PRINCIPAL_UNIT = "SELECT business_unit FROM users WHERE id = $1 FOR NO KEY UPDATE"
# The principal a named key belongs to, and its business unit; no row: no such key.
KEY_UNIT = """
SELECT u.id, u.business_unit, u.kind FROM mesh_api_keys k JOIN users u ON u.id = k.user_id WHERE k.id = $1
"""
# What a unit administrator's write to a person ($1) may not undo: whether the person is active,
# its expiry and its primary key's; no row: no such person.
USER_STANDING = """
SELECT u.status, u.expires_at,
       (SELECT k.expires_at FROM mesh_api_keys k WHERE k.user_id = u.id AND k.status = 'active' AND k.name IS NULL
        AND k.replaced_by IS NULL ORDER BY k.created_at DESC LIMIT 1) AS key_expires_at
FROM users u WHERE u.id = $1 AND u.kind = 'user'
"""
# The same in a write's transaction, before its work, held to its commit.
LOCK_USER_STANDING = USER_STANDING.rstrip() + " FOR NO KEY UPDATE OF u\n"
# A would-be manager's business unit, by id ($1) or by email ($2); no row: no such person.
MANAGER_UNIT_BY_ID = "SELECT business_unit FROM users WHERE id = $1 AND kind = 'user'"
MANAGER_UNIT_BY_EMAIL = "SELECT business_unit FROM users WHERE email = $1 AND kind = 'user'"
# The highest daily cap a person's policies set ($1); NULL: none.
HIGHEST_POLICY_CAP = "SELECT max(daily_cap_usd) FROM user_model_policies WHERE user_id = $1"
# A unit's lock ($1: its name); no row: no such unit.
UNIT_LOCK = "SELECT daily_cap_lock_usd FROM business_units WHERE name = $1"
# The same in a write's transaction, held to its commit: the lock cannot change under the write.
LOCK_UNIT_LOCK = "SELECT daily_cap_lock_usd FROM business_units WHERE name = $1 FOR SHARE"
# The daily cap a policy sets now ($1 user, $2 model); no row: the default applies.
POLICY_CAP = "SELECT daily_cap_usd FROM user_model_policies WHERE user_id = $1 AND model_id = $2"
