"""Token issuers' SQL (trusted issuers, their key sets, just-in-time provisioning), as named
constants with ``$n`` parameters."""

# NOTE: INSERT_ISSUER, LIST_ISSUERS and GET_ISSUER return the same columns.
INSERT_ISSUER = """
INSERT INTO issuers (issuer, audiences, algorithms, claims, jwks_url, jwks, clock_skew_s, jit_provisioning, local)
VALUES ($1, $2, $3, $4::jsonb, $5, $6::jsonb, $7, $8, $9)
RETURNING id, issuer, audiences, algorithms, clock_skew_s, claims::text AS claims, jit_provisioning, local,
          jwks_url, jwks::text AS jwks, fetched_jwks::text AS fetched_jwks, fetched_at, fetch_error, created_at
"""
LIST_ISSUERS = """
SELECT id, issuer, audiences, algorithms, clock_skew_s, claims::text AS claims, jit_provisioning, local,
       jwks_url, jwks::text AS jwks, fetched_jwks::text AS fetched_jwks, fetched_at, fetch_error, created_at
FROM issuers ORDER BY issuer
"""
GET_ISSUER = """
SELECT id, issuer, audiences, algorithms, clock_skew_s, claims::text AS claims, jit_provisioning, local,
       jwks_url, jwks::text AS jwks, fetched_jwks::text AS fetched_jwks, fetched_at, fetch_error, created_at
FROM issuers WHERE id = $1
"""
DELETE_ISSUER = "DELETE FROM issuers WHERE id = $1 RETURNING issuer"
COUNT_ISSUERS = "SELECT count(*) FROM issuers"

# --- key set fetches (the leader) ------------------------------------------------------------

# What the leader fetches: due by age, or asked for by a worker since the last attempt, and never
# twice within the minimum interval.
DUE_ISSUERS = """
SELECT id, issuer, jwks_url, local, algorithms, fetched_jwks::text AS fetched_jwks, published_at
FROM issuers
WHERE jwks_url IS NOT NULL
  AND (fetch_attempted_at IS NULL OR fetch_attempted_at < now() - make_interval(secs => $2))
  AND (fetched_at IS NULL OR fetched_at < now() - make_interval(secs => $1)
       OR (fetch_requested_at IS NOT NULL AND fetch_requested_at > fetch_attempted_at))
ORDER BY issuer
"""
MARK_ATTEMPT = "UPDATE issuers SET fetch_attempted_at = now() WHERE id = $1"
STORE_FAILURE = "UPDATE issuers SET fetch_error = $2 WHERE id = $1"
STORE_FETCH = """
UPDATE issuers SET fetched_jwks = $2::jsonb, fetched_at = now(), fetch_error = NULL,
                   published_at = CASE WHEN $3 THEN now() ELSE published_at END
WHERE id = $1
"""
REQUEST_FETCH = """
UPDATE issuers SET fetch_requested_at = now()
WHERE issuer = $1 AND jwks_url IS NOT NULL
  AND (fetch_requested_at IS NULL OR fetch_requested_at < now() - make_interval(secs => $2))
"""

# --- registry files --------------------------------------------------------------------------

STORED_ISSUER = """
SELECT audiences, algorithms, claims::text AS claims, jwks_url, jwks::text AS jwks, clock_skew_s, jit_provisioning,
       local
FROM issuers WHERE issuer = $1
"""
UPDATE_ISSUER = """
UPDATE issuers SET audiences = $2, algorithms = $3, claims = $4::jsonb, jwks_url = $5, jwks = $6::jsonb,
                   clock_skew_s = $7, jit_provisioning = $8, local = $9,
                   fetched_jwks = CASE WHEN jwks_url IS DISTINCT FROM $5 THEN NULL ELSE fetched_jwks END
WHERE issuer = $1
"""

# --- just-in-time provisioning ---------------------------------------------------------------

INSERT_JIT_USER = """
INSERT INTO users (email, display_name, business_unit, tier, manager_id)
VALUES ($1, $2, $3, $4, (SELECT id FROM users WHERE email = $5))
ON CONFLICT (email) DO NOTHING
RETURNING id
"""
