"""Model onboarding's and pilots' SQL (API.md "Governed lifecycle"), as named constants with
``$n`` parameters."""

PILOT_COLUMNS = "id, name, members, models, authoritative, mode, expires_at, tiers, version, created_at, updated_at"

LIST_PILOTS = """
SELECT id, name, members, models, authoritative, mode, expires_at, tiers, version, created_at, updated_at
FROM pilots ORDER BY created_at, id
"""
GET_PILOT = """
SELECT id, name, members, models, authoritative, mode, expires_at, tiers, version, created_at, updated_at
FROM pilots WHERE id = $1
"""
PILOT_FOR_UPDATE = "SELECT version FROM pilots WHERE id = $1 FOR UPDATE"
# Every pilot's members and expiry (the double-enrollment check), the pilots table locked
# against a concurrent enrollment.
LOCK_PILOTS = "LOCK TABLE pilots IN SHARE ROW EXCLUSIVE MODE"
PILOT_ENROLLMENTS = "SELECT id, name, members, expires_at FROM pilots"
INSERT_PILOT = """
INSERT INTO pilots (name, members, models, authoritative, mode, expires_at, tiers)
VALUES ($1, $2::jsonb, $3::jsonb, $4, $5, $6, $7::jsonb)
RETURNING id, name, members, models, authoritative, mode, expires_at, tiers, version, created_at, updated_at
"""
UPDATE_PILOT = """
UPDATE pilots SET name = $2, members = $3::jsonb, models = $4::jsonb, authoritative = $5, mode = $6,
                  expires_at = $7, tiers = $8::jsonb, version = version + 1, updated_at = now()
WHERE id = $1
RETURNING id, name, members, models, authoritative, mode, expires_at, tiers, version, created_at, updated_at
"""
DELETE_PILOT = "DELETE FROM pilots WHERE id = $1 RETURNING id"
# Which of these ids are users (people, not applications).
KNOWN_PEOPLE = "SELECT id::text FROM users WHERE id = ANY($1::uuid[]) AND kind = 'user'"
MODEL_NAMES = "SELECT name FROM models"
KNOWN_PILOTS = "SELECT id::text FROM pilots WHERE id = ANY($1::uuid[])"

# --- a model's onboarding ------------------------------------------------------------------

SET_ONBOARDING = """
UPDATE models SET status = $2, roster = $3::jsonb, limited_window = $4, limited_amount_usd = $5,
                  limited_expires_at = $6, version = version + 1, updated_at = now()
WHERE id = $1
"""
# The live controls naming a model (the 409 of a delete): rules scoping it by name, live pilots
# listing it, named keys holding it, workflows are per principal and name no model.
RULES_NAMING_MODEL = """
SELECT id FROM rules r
WHERE EXISTS (SELECT 1 FROM jsonb_array_elements(r.body -> 'entries') e WHERE e -> 'scope' ->> 'model' = $1)
ORDER BY id
"""
LIVE_PILOTS_LISTING_MODEL = """
SELECT id::text FROM pilots WHERE models ? $1 AND (expires_at IS NULL OR expires_at > now()) ORDER BY id
"""
# Live named keys held to a subset that includes the model (a key whose subset loses every model
# may call none: deleting its model would silently take the key's access away).
LIVE_KEYS_HOLDING_MODEL = """
SELECT id::text FROM mesh_api_keys
WHERE $1::uuid = ANY(models) AND status = 'active' AND (expires_at IS NULL OR expires_at > now())
ORDER BY id
"""
MODEL_NAME = "SELECT name FROM models WHERE id = $1"
MODEL_ONBOARDING = """
SELECT status, roster, limited_window, limited_amount_usd, limited_expires_at FROM models WHERE id = $1
"""
# A model renamed: the pilots listing it follow (as the rules scoping it do).
RENAME_MODEL_IN_PILOTS = """
UPDATE pilots SET models = (SELECT jsonb_agg(CASE WHEN v = $1 THEN $2 ELSE v END)
                            FROM jsonb_array_elements_text(models) AS v),
                  version = version + 1, updated_at = now()
WHERE models ? $1
RETURNING id::text
"""
