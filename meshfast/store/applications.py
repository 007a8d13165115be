"""Applications' SQL (principals of kind 'application', owned by a user), as named constants with
``$n`` parameters."""

# NOTE: LIST_APPLICATIONS and GET_APPLICATION share their columns and joins: an application, its
# owner's email and its current primary key's prefix.
LIST_APPLICATIONS = """
SELECT a.id, a.display_name AS name, a.owner_id, o.email AS owner_email, a.business_unit, a.status, a.version,
       a.created_at, a.updated_at, k.key_prefix
FROM users a
JOIN users o ON o.id = a.owner_id
LEFT JOIN LATERAL (
    SELECT key_prefix FROM mesh_api_keys
    WHERE user_id = a.id AND name IS NULL AND status = 'active' AND replaced_by IS NULL
    ORDER BY created_at DESC LIMIT 1
) k ON true
WHERE a.kind = 'application' ORDER BY lower(a.display_name)
"""
GET_APPLICATION = """
SELECT a.id, a.display_name AS name, a.owner_id, o.email AS owner_email, a.business_unit, a.status, a.version,
       a.created_at, a.updated_at, k.key_prefix
FROM users a
JOIN users o ON o.id = a.owner_id
LEFT JOIN LATERAL (
    SELECT key_prefix FROM mesh_api_keys
    WHERE user_id = a.id AND name IS NULL AND status = 'active' AND replaced_by IS NULL
    ORDER BY created_at DESC LIMIT 1
) k ON true
WHERE a.id = $1 AND a.kind = 'application'
"""
# The owner held (FOR KEY SHARE) until the write commits, so it cannot be deleted meanwhile.
OWNER_EXISTS = "SELECT 1 FROM users WHERE id = $1 AND kind = 'user' FOR KEY SHARE"
INSERT_APPLICATION = """
INSERT INTO users (kind, display_name, owner_id, business_unit) VALUES ('application', $1, $2, $3) RETURNING id
"""
INSERT_APPLICATION_KEY = "INSERT INTO mesh_api_keys (user_id, key_hash, key_prefix) VALUES ($1, $2, $3)"
APPLICATION_FOR_UPDATE = """
SELECT display_name, owner_id, business_unit, status, version FROM users
WHERE id = $1 AND kind = 'application' FOR UPDATE
"""
UPDATE_APPLICATION = """
UPDATE users SET display_name = $2, owner_id = $3, business_unit = $4, status = $5, version = version + 1,
    updated_at = now()
WHERE id = $1
"""
DELETE_APPLICATION = "DELETE FROM users WHERE id = $1 AND kind = 'application' RETURNING id"

# --- registry files --------------------------------------------------------------------------

# The applications of these names ($1, lower case), keyed by their lower-case name.
APPLICATIONS_BY_NAME = """
SELECT lower(display_name) AS key, id, owner_id, business_unit FROM users
WHERE kind = 'application' AND lower(display_name) = ANY($1::text[])
"""
UPDATE_APPLICATION_OWNER = """
UPDATE users SET owner_id = $2, business_unit = $3, version = version + 1, updated_at = now() WHERE id = $1
"""
