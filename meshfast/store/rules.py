"""Spend rules' SQL (the rules, their enforcement switch and models' restrictions), as named
constants with ``$n`` parameters."""

LIST_RULES = "SELECT id, body, version, created_at, updated_at FROM rules ORDER BY id"
GET_RULE = "SELECT id, body, version, created_at, updated_at FROM rules WHERE id = $1"
STORED_RULES = "SELECT id, body FROM rules"
RULE_FOR_UPDATE = "SELECT version FROM rules WHERE id = $1 FOR UPDATE"
INSERT_RULE = """
INSERT INTO rules (id, body) VALUES ($1, $2::jsonb) ON CONFLICT (id) DO NOTHING
RETURNING id, body, version, created_at, updated_at
"""
UPDATE_RULE = """
UPDATE rules SET body = $2::jsonb, version = version + 1, updated_at = now() WHERE id = $1
RETURNING id, body, version, created_at, updated_at
"""
DELETE_RULE = "DELETE FROM rules WHERE id = $1 RETURNING id"
# People as their ids, applications marked (rules.APPLICATION_MARK): a leader must be a person.
KNOWN_USERS = """
SELECT CASE WHEN kind = 'application' THEN 'application:' || id::text ELSE id::text END
FROM users WHERE id = ANY($1::uuid[])
"""
MODEL_NAMES = "SELECT name, aliases, tags FROM models"
GET_ENFORCEMENT = "SELECT enforce_rules FROM gateway_state"
SET_ENFORCEMENT = "UPDATE gateway_state SET enforce_rules = $1, updated_at = now() RETURNING enforce_rules"
SET_RESTRICTIONS = """
UPDATE models SET restrictions = $2::jsonb, version = version + 1, updated_at = now() WHERE id = $1
"""

# --- registry files ------------------------------------------------------------------------

USER_EMAILS = "SELECT email, id::text FROM users WHERE kind = 'user'"
RESTRICTIONS_BY_NAME = "SELECT id, name, restrictions FROM models WHERE name = ANY($1::text[])"
