"""Data protection policies' SQL, as named constants with ``$n`` parameters."""

LIST_POLICIES = "SELECT name, body::text AS body, version, created_at, updated_at FROM dlp_policies ORDER BY name"
GET_POLICY = "SELECT name, body::text AS body, version, created_at, updated_at FROM dlp_policies WHERE name = $1"
UPSERT_POLICY = """
INSERT INTO dlp_policies (name, body) VALUES ($1, $2::jsonb)
ON CONFLICT (name) DO UPDATE SET body = EXCLUDED.body, version = dlp_policies.version + 1, updated_at = now()
RETURNING name, body::text AS body, version, created_at, updated_at
"""
DELETE_POLICY = "DELETE FROM dlp_policies WHERE name = $1 RETURNING name"
OTHER_POLICIES = "SELECT name, body::text AS body FROM dlp_policies WHERE name <> $1"
# Policy writes take turns (an advisory lock held to commit), so the custom detectors each one
# checks against the other policies are the ones it commits beside.
LOCK_POLICIES = "SELECT pg_advisory_xact_lock(7164805235869627513)"
KNOWN_MODELS = "SELECT name FROM models WHERE name = ANY($1::text[])"
KNOWN_PROVIDERS = "SELECT name FROM providers WHERE name = ANY($1::text[])"
KNOWN_PRINCIPALS = "SELECT id::text FROM users WHERE id = ANY($1::uuid[]) AND kind = $2"

# --- registry files: names to ids ------------------------------------------------------------

PEOPLE_BY_EMAIL = "SELECT lower(email), id::text FROM users WHERE kind = 'user' AND lower(email) = ANY($1::text[])"
APPLICATIONS_BY_NAME = """
SELECT lower(display_name), id::text FROM users WHERE kind = 'application' AND lower(display_name) = ANY($1::text[])
"""
STORED_BODY = "SELECT body::text FROM dlp_policies WHERE name = $1"
