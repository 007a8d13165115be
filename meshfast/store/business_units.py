"""Business units and their administrators (meshfast/admin/business_units.py), as named
constants with ``$n`` parameters."""

_COLUMNS = """
b.id, b.name, b.timezone, b.daily_cap_lock_usd, b.version, b.created_at, b.updated_at,
ARRAY(SELECT ba.admin_id::text FROM business_unit_admins ba WHERE ba.business_unit_id = b.id
      ORDER BY ba.admin_id) AS admins
"""

LIST_UNITS = "SELECT " + _COLUMNS + " FROM business_units b ORDER BY b.name"
GET_UNIT = "SELECT " + _COLUMNS + " FROM business_units b WHERE b.id = $1"
UNIT_FOR_UPDATE = "SELECT id, name, version FROM business_units WHERE id = $1 FOR UPDATE"
INSERT_UNIT = """
INSERT INTO business_units (name, timezone, daily_cap_lock_usd) VALUES ($1, $2, $3) RETURNING id
"""
UPDATE_UNIT = """
UPDATE business_units SET name = $2, timezone = $3, daily_cap_lock_usd = $4, version = version + 1, updated_at = now()
WHERE id = $1
"""
CLEAR_UNIT_ADMINS = "DELETE FROM business_unit_admins WHERE business_unit_id = $1"
ADD_UNIT_ADMINS = """
INSERT INTO business_unit_admins (business_unit_id, admin_id) SELECT $1, unnest($2::uuid[])
"""
# Admin tokens scoped to a renamed unit follow the new name (units are named in their scope).
RENAME_IN_TOKENS = """
UPDATE admin_tokens SET business_units = array_replace(business_units, $1, $2) WHERE $1 = ANY(business_units)
"""

# Those of the ids ``$1`` that name admins, and whether each is a platform administrator.
ADMINS_BY_IDS = "SELECT id::text AS id, is_super FROM admins WHERE id = ANY($1::uuid[])"
# The units of the names ``$1`` that exist, with their locks.
UNITS_BY_NAMES = "SELECT name, daily_cap_lock_usd FROM business_units WHERE name = ANY($1::text[])"

# --- what a scope check reads ---------------------------------------------------------------

# A person's (or application's) business unit; no row: no such principal.
PRINCIPAL_UNIT = "SELECT business_unit FROM users WHERE id = $1"
# The same in a write's transaction, held to its commit: the unit cannot change under the write.
LOCK_PRINCIPAL_UNIT = "SELECT business_unit FROM users WHERE id = $1 FOR NO KEY UPDATE"
# The principal a named key belongs to, and its business unit; no row: no such key.
KEY_UNIT = """
SELECT u.id, u.business_unit FROM mesh_api_keys k JOIN users u ON u.id = k.user_id WHERE k.id = $1
"""
# A unit's lock ($1: its name); no row: no such unit.
UNIT_LOCK = "SELECT daily_cap_lock_usd FROM business_units WHERE name = $1"
# The daily cap a policy sets now ($1 user, $2 model); no row: the default applies.
POLICY_CAP = "SELECT daily_cap_usd FROM user_model_policies WHERE user_id = $1 AND model_id = $2"
