"""SQL the app runs, as named constants with ``$n`` parameters. Each constant is the text PostgreSQL
receives: constant text, its columns written out."""

# --- configuration propagation -------------------------------------------------------------

NEXT_CONFIG_SEQ = "UPDATE gateway_state SET config_seq = nextval('meshfast_config_seq') RETURNING config_seq"
NOTIFY_CONFIG = "SELECT pg_notify('meshfast_config', $1::text)"
CONFIG_CHANNEL = "meshfast_config"

# --- snapshot (gateway role, one REPEATABLE READ transaction) -------------------------------

SNAPSHOT_SEQ = "SELECT config_seq FROM gateway_state"
ZONE_KNOWN = "SELECT 1 FROM pg_timezone_names WHERE name = $1"
SNAPSHOT_KILL_SWITCH = "SELECT kill_switch FROM gateway_state"
SNAPSHOT_ENFORCE_RULES = "SELECT enforce_rules FROM gateway_state"
SNAPSHOT_RULES = "SELECT id, body FROM rules ORDER BY id"
SNAPSHOT_NOW = "SELECT now()"
SNAPSHOT_PILOTS = """
SELECT id, name, members, models, authoritative, mode, expires_at, tiers FROM pilots ORDER BY id
"""
SNAPSHOT_WORKFLOWS = """
SELECT id, uid::text AS uid, limit_nano_usd, "window", principals::text AS principals FROM workflows ORDER BY id
"""
SNAPSHOT_DLP = "SELECT name, body::text AS body FROM dlp_policies ORDER BY name"
SNAPSHOT_ISSUERS = """
SELECT id::text AS id, issuer, audiences, algorithms, clock_skew_s, claims::text AS claims, jit_provisioning,
       COALESCE(jwks, fetched_jwks)::text AS jwks, jwks_url IS NOT NULL AS fetched, published_at
FROM issuers ORDER BY issuer
"""
# Ids as text and people as indexes (positions in this ORDER BY id), computed here rather than
# per row in Python: 100,000 people and their keys.
SNAPSHOT_PRINCIPALS = """
WITH principal AS (SELECT id, (row_number() OVER (ORDER BY id))::int - 1 AS i FROM users)
SELECT u.id::text AS id, u.email, u.display_name, u.status, u.expires_at, u.manager_id, m.i AS manager,
       u.business_unit, u.tier, u.kind
FROM users u LEFT JOIN principal m ON m.id = u.manager_id
ORDER BY u.id
"""
SNAPSHOT_PRINCIPAL = """
SELECT id, email, display_name, status, expires_at, manager_id, business_unit, tier, kind FROM users WHERE id = $1
"""
SNAPSHOT_KEYS = """
WITH principal AS (SELECT id, (row_number() OVER (ORDER BY id))::int - 1 AS i FROM users)
SELECT k.id::text AS id, u.i AS principal, k.key_hash, k.status, k.expires_at, k.models::text[] AS models
FROM mesh_api_keys k JOIN principal u ON u.id = k.user_id
WHERE k.status = 'active'
"""
SNAPSHOT_PROVIDERS = """
SELECT id, name, family, base_url, encrypted_api_key, key_nonce, local, max_outbound_rps,
       max_concurrent_upstream, max_calls_per_hour, retry_enabled, max_retries, retry_backoff_ms,
       log_requests, supports_web_search, settings
FROM providers ORDER BY id
"""
SNAPSHOT_MODELS = """
SELECT id, provider_id, name, resolved_model, kind, created_at, blocked, status, max_output_tokens,
       price_per_second,
       supports_image_in, supports_document_in, supports_audio_in, supports_video_in,
       supports_web_search, output_media_type,
       input_price_per_1k_tokens, output_price_per_1k_tokens, cache_read_price_per_1k_tokens,
       cache_write_price_per_1k_tokens, cache_write_1h_price_per_1k_tokens,
       long_context_threshold_tokens, long_context_prices, aliases, tags, restrictions, cache_shaping, cache_ttl,
       roster, limited_window, limited_amount_usd, limited_expires_at
FROM models ORDER BY id
"""
SNAPSHOT_DEPLOYMENTS = """
SELECT id, model_id, provider_id, resolved_model, region, priority
FROM model_deployments ORDER BY model_id, priority, created_at, id
"""
# The grants as one byte string, 12 bytes a grant: the principal's index (in SNAPSHOT_PRINCIPALS'
# order), the model's (in SNAPSHOT_MODELS'), and the index of its terms in SNAPSHOT_GRANT_TERMS
# (0: no policy row, the defaults), each a big-endian int4: a million grants cross as 12 MB
# instead of a million rows. NOTE: the ORDER BY of the terms' rank is SNAPSHOT_GRANT_TERMS'.
SNAPSHOT_GRANT_TABLE = """
WITH principal AS (SELECT id, (row_number() OVER (ORDER BY id))::int - 1 AS i FROM users),
     model AS (SELECT id, (row_number() OVER (ORDER BY id))::int - 1 AS i FROM models),
     policy AS (
         SELECT user_id, model_id,
                (dense_rank() OVER (ORDER BY daily_cap_usd, max_calls_per_hour, allowed_from, allowed_to,
                                             timezone, active_days, always_open))::int AS k
         FROM user_model_policies)
SELECT string_agg(int4send(u.i) || int4send(m.i) || int4send(COALESCE(p.k, 0)), ''::bytea) AS packed
FROM user_model_access a
JOIN principal u ON u.id = a.user_id
JOIN model m ON m.id = a.model_id
LEFT JOIN policy p ON p.user_id = a.user_id AND p.model_id = a.model_id
"""
# Index 0: the terms of a grant without a policy row ($20/day, every day, no window, no hourly
# cap); then each distinct policy, in the order SNAPSHOT_GRANT_TABLE ranks them.
SNAPSHOT_GRANT_TERMS = """
SELECT 0 AS k, 20.00::numeric AS daily_cap_usd, NULL::integer AS max_calls_per_hour, NULL::time AS allowed_from,
       NULL::time AS allowed_to, 'UTC'::text AS timezone, '{0,1,2,3,4,5,6}'::integer[] AS active_days,
       false AS always_open
UNION ALL
SELECT (row_number() OVER (ORDER BY daily_cap_usd, max_calls_per_hour, allowed_from, allowed_to, timezone,
                                    active_days, always_open))::int,
       daily_cap_usd, max_calls_per_hour, allowed_from, allowed_to, timezone, active_days, always_open
FROM (SELECT DISTINCT daily_cap_usd, max_calls_per_hour, allowed_from, allowed_to, timezone, active_days,
                      always_open
      FROM user_model_policies) d
ORDER BY k
"""

# --- admin tokens ----------------------------------------------------------------------------

BOOTSTRAP_TOKEN_HASH = """
SELECT token_hash FROM admin_tokens WHERE name = 'bootstrap' AND revoked_at IS NULL
"""
REVOKE_BOOTSTRAP_TOKEN = """
UPDATE admin_tokens SET revoked_at = now() WHERE name = 'bootstrap' AND revoked_at IS NULL
"""
INSERT_BOOTSTRAP_TOKEN = """
INSERT INTO admin_tokens (name, token_hash, is_super, created_by)
VALUES ('bootstrap', $1, true, $2)
"""

# --- audit -----------------------------------------------------------------------------------

INSERT_AUDIT = """
INSERT INTO admin_audit_log (actor, action, target, detail) VALUES ($1, $2, $3, $4::jsonb)
"""
# The same, naming the business unit the change concerns ($5; NULL: platform-wide).
INSERT_UNIT_AUDIT = """
INSERT INTO admin_audit_log (actor, action, target, detail, business_unit) VALUES ($1, $2, $3, $4::jsonb, $5)
"""

# --- users and keys --------------------------------------------------------------------------

INSERT_USER = """
INSERT INTO users (email, display_name, manager_id, business_unit, tier)
VALUES ($1, $2, $3, $4, $5)
RETURNING id, email, display_name, manager_id, business_unit, tier, status, expires_at, created_at
"""
INSERT_KEY = """
INSERT INTO mesh_api_keys (user_id, key_hash, key_prefix) VALUES ($1, $2, $3)
RETURNING id
"""
REVOKE_ACTIVE_KEYS = """
UPDATE mesh_api_keys SET status = 'revoked', revoked_at = now()
WHERE user_id = $1 AND status = 'active'
"""
# The primary key and any it was rotated away from (POST /admin/users/{id}/rotate-key: the
# previous key stops working at once); named keys are left as they are.
REVOKE_PRIMARY_KEYS = """
UPDATE mesh_api_keys SET status = 'revoked', revoked_at = now()
WHERE user_id = $1 AND status = 'active' AND name IS NULL
"""
INSERT_NAMED_KEY = """
INSERT INTO mesh_api_keys AS k (user_id, key_hash, key_prefix, name, expires_at, models)
VALUES ($1, $2, $3, $4, $5, $6::uuid[])
RETURNING
k.id, k.user_id, k.name, k.key_prefix, k.status, k.expires_at, k.models::text[] AS models, k.replaced_by,
k.created_at, k.revoked_at
"""
LIST_USER_KEYS = """
SELECT
k.id, k.user_id, k.name, k.key_prefix, k.status, k.expires_at, k.models::text[] AS models, k.replaced_by,
k.created_at, k.revoked_at
FROM mesh_api_keys k WHERE k.user_id = $1 ORDER BY k.created_at DESC, k.id
"""
# A person's row held while their keys change (NO KEY UPDATE: inserts that reference the person,
# such as spend checkpoints, are not held up by it).
LOCK_USER = "SELECT id FROM users WHERE id = $1 FOR NO KEY UPDATE"
# The same, of a principal of one kind ($2: 'user' or 'application').
LOCK_PRINCIPAL = "SELECT id FROM users WHERE id = $1 AND kind = $2 FOR NO KEY UPDATE"
KEY_OWNER = "SELECT user_id FROM mesh_api_keys WHERE id = $1"
KEY_FOR_UPDATE = """
SELECT
k.id, k.user_id, k.name, k.key_prefix, k.status, k.expires_at, k.models::text[] AS models, k.replaced_by,
k.created_at, k.revoked_at
FROM mesh_api_keys k WHERE k.id = $1 FOR UPDATE
"""
# A key rotated away from: replaced now; it works for the overlap (never past its own expiry),
# or stops at once without one.
RETIRE_KEY = """
UPDATE mesh_api_keys SET replaced_by = $2,
    status = CASE WHEN $3::timestamptz IS NULL THEN 'revoked' ELSE status END,
    revoked_at = CASE WHEN $3::timestamptz IS NULL THEN now() ELSE revoked_at END,
    expires_at = CASE WHEN $3::timestamptz IS NULL THEN expires_at
                      ELSE LEAST(COALESCE(expires_at, $3::timestamptz), $3::timestamptz) END
WHERE id = $1
"""
SET_REPLACED_BY = "UPDATE mesh_api_keys SET replaced_by = $2 WHERE id = $1"
REVOKE_KEY = """
UPDATE mesh_api_keys SET status = 'revoked', revoked_at = now() WHERE id = $1 AND status = 'active'
"""
MODELS_EXISTING = "SELECT id FROM models WHERE id = ANY($1::uuid[])"
ACTIVATE_USER = "UPDATE users SET status = 'active' WHERE id = $1 AND kind = 'user' RETURNING id"
REVOKE_USER = "UPDATE users SET status = 'revoked' WHERE id = $1 AND kind = 'user' RETURNING id"
DELETE_USER = "DELETE FROM users WHERE id = $1 AND kind = 'user' RETURNING id"
# Manager changes run one at a time (an advisory lock held to commit), so the chain each one
# checks for a loop is the chain it commits: two changes cannot each pass and loop together.
LOCK_ORGANISATION = "SELECT pg_advisory_xact_lock(7164805235869627512)"
USER_ID_BY_EMAIL = "SELECT id FROM users WHERE email = $1"
USER_FOR_UPDATE = """
SELECT version, display_name, manager_id, business_unit, tier, expires_at FROM users WHERE id = $1 AND kind = 'user'
FOR UPDATE
"""
# True when `$2` (a would-be manager) is `$1` or reports to `$1`: making `$2` the manager of
# `$1` would close a loop. UNION (not UNION ALL) ends the walk at a repeat, loop or not.
MANAGER_WOULD_LOOP = """
WITH RECURSIVE chain (id) AS (
    SELECT $2::uuid
    UNION
    SELECT u.manager_id FROM chain c JOIN users u ON u.id = c.id WHERE u.manager_id IS NOT NULL
)
SELECT EXISTS (SELECT 1 FROM chain WHERE id = $1)
"""
ORGANISATION = "SELECT id, email, manager_id, business_unit, tier FROM users WHERE kind = 'user'"
UPDATE_USER_ORGANISATION = """
UPDATE users SET manager_id = $2, business_unit = $3, tier = $4, version = version + 1, updated_at = now()
WHERE id = $1
"""
UPDATE_USER = """
UPDATE users SET display_name = $2, manager_id = $3, business_unit = $4, tier = $5, expires_at = $6,
    version = version + 1, updated_at = now()
WHERE id = $1
"""
SET_USER_EXPIRY = """
UPDATE users SET expires_at = $2, version = version + 1, updated_at = now() WHERE id = $1 AND kind = 'user'
RETURNING id
"""
SET_KEY_EXPIRY = """
UPDATE mesh_api_keys SET expires_at = $2
WHERE user_id = $1 AND status = 'active' AND name IS NULL AND replaced_by IS NULL RETURNING id
"""
LIST_USERS = """
SELECT
u.id, u.email, u.display_name, u.manager_id, mgr.email AS manager_email, u.business_unit, u.tier, u.status,
u.expires_at, u.version, u.created_at, u.updated_at, k.key_prefix, k.status AS key_status,
k.expires_at AS key_expires_at
FROM users u
LEFT JOIN users mgr ON mgr.id = u.manager_id
LEFT JOIN LATERAL (
    SELECT key_prefix, status, expires_at FROM mesh_api_keys
    WHERE user_id = u.id AND name IS NULL ORDER BY (status = 'active') DESC, created_at DESC LIMIT 1
) k ON true
WHERE u.kind = 'user'
ORDER BY u.created_at DESC
"""
GET_USER = """
SELECT
u.id, u.email, u.display_name, u.manager_id, mgr.email AS manager_email, u.business_unit, u.tier, u.status,
u.expires_at, u.version, u.created_at, u.updated_at, k.key_prefix, k.status AS key_status,
k.expires_at AS key_expires_at
FROM users u
LEFT JOIN users mgr ON mgr.id = u.manager_id
LEFT JOIN LATERAL (
    SELECT key_prefix, status, expires_at FROM mesh_api_keys
    WHERE user_id = u.id AND name IS NULL ORDER BY (status = 'active') DESC, created_at DESC LIMIT 1
) k ON true
WHERE u.id = $1 AND u.kind = 'user'
"""

# --- providers and models --------------------------------------------------------------------

INSERT_PROVIDER = """
INSERT INTO providers (id, name, family, base_url, encrypted_api_key, key_nonce, local,
    max_outbound_rps, max_concurrent_upstream, max_calls_per_hour, retry_enabled, max_retries,
    retry_backoff_ms, log_requests, supports_web_search, settings)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16::jsonb)
RETURNING
id, name, family, base_url, local, max_outbound_rps, max_concurrent_upstream, max_calls_per_hour,
retry_enabled, max_retries, retry_backoff_ms, log_requests, supports_web_search, settings, version,
created_at, updated_at
"""
LIST_PROVIDERS = """
SELECT
id, name, family, base_url, local, max_outbound_rps, max_concurrent_upstream, max_calls_per_hour,
retry_enabled, max_retries, retry_backoff_ms, log_requests, supports_web_search, settings, version,
created_at, updated_at
FROM providers ORDER BY created_at DESC
"""
GET_PROVIDER = """
SELECT
id, name, family, base_url, local, max_outbound_rps, max_concurrent_upstream, max_calls_per_hour,
retry_enabled, max_retries, retry_backoff_ms, log_requests, supports_web_search, settings, version,
created_at, updated_at
FROM providers WHERE id = $1
"""
PROVIDER_FOR_SNAPSHOT = """
SELECT id, name, family, base_url, encrypted_api_key, key_nonce, local, max_outbound_rps,
       max_concurrent_upstream, max_calls_per_hour, retry_enabled, max_retries, retry_backoff_ms,
       log_requests, supports_web_search, settings
FROM providers WHERE id = $1
"""
DELETE_PROVIDER = "DELETE FROM providers WHERE id = $1 RETURNING id"

# Registry writes run one at a time (an advisory lock held to commit), so the registry each one
# validates is the registry it commits: no two writes can add clashing aliases side by side.
LOCK_REGISTRY = "SELECT pg_advisory_xact_lock(7164805235869627511)"

INSERT_MODEL = """
INSERT INTO models (provider_id, name, resolved_model, kind, input_price_per_1k_tokens,
    output_price_per_1k_tokens, cache_read_price_per_1k_tokens, cache_write_price_per_1k_tokens,
    cache_write_1h_price_per_1k_tokens, long_context_threshold_tokens, long_context_prices,
    price_per_second, max_output_tokens, aliases, tags, supports_image_in, supports_document_in,
    supports_audio_in, supports_video_in, supports_web_search, output_media_type, cache_shaping, cache_ttl)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11::jsonb, $12, $13, $14, $15, $16, $17, $18, $19,
    $20, $21, $22, $23)
RETURNING id
"""
LIST_MODELS = """
SELECT
m.id, m.provider_id, p.name AS provider_name, m.name, m.resolved_model, m.kind, m.status, m.blocked,
m.input_price_per_1k_tokens, m.output_price_per_1k_tokens, m.cache_read_price_per_1k_tokens,
m.cache_write_price_per_1k_tokens, m.cache_write_1h_price_per_1k_tokens,
m.long_context_threshold_tokens, m.long_context_prices, m.price_per_second, m.max_output_tokens,
m.aliases, m.tags, m.supports_image_in, m.supports_document_in, m.supports_audio_in,
m.supports_video_in, m.supports_web_search, m.output_media_type, m.cache_shaping, m.cache_ttl, m.restrictions,
m.roster, m.limited_window, m.limited_amount_usd, m.limited_expires_at,
m.version, m.created_at, m.updated_at
FROM models m JOIN providers p ON p.id = m.provider_id ORDER BY m.created_at DESC
"""
GET_MODEL = """
SELECT
m.id, m.provider_id, p.name AS provider_name, m.name, m.resolved_model, m.kind, m.status, m.blocked,
m.input_price_per_1k_tokens, m.output_price_per_1k_tokens, m.cache_read_price_per_1k_tokens,
m.cache_write_price_per_1k_tokens, m.cache_write_1h_price_per_1k_tokens,
m.long_context_threshold_tokens, m.long_context_prices, m.price_per_second, m.max_output_tokens,
m.aliases, m.tags, m.supports_image_in, m.supports_document_in, m.supports_audio_in,
m.supports_video_in, m.supports_web_search, m.output_media_type, m.cache_shaping, m.cache_ttl, m.restrictions,
m.roster, m.limited_window, m.limited_amount_usd, m.limited_expires_at,
m.version, m.created_at, m.updated_at
FROM models m JOIN providers p ON p.id = m.provider_id WHERE m.id = $1
"""
DELETE_MODEL = "DELETE FROM models WHERE id = $1 RETURNING id"
MODEL_ID_BY_NAME = "SELECT id FROM models WHERE name = $1"
UPDATE_MODEL = """
UPDATE models SET provider_id = $2, resolved_model = $3, kind = $4, input_price_per_1k_tokens = $5,
    output_price_per_1k_tokens = $6, cache_read_price_per_1k_tokens = $7,
    cache_write_price_per_1k_tokens = $8, cache_write_1h_price_per_1k_tokens = $9,
    long_context_threshold_tokens = $10, long_context_prices = $11::jsonb, price_per_second = $12,
    max_output_tokens = $13, aliases = $14, tags = $15, supports_image_in = $16,
    supports_document_in = $17, supports_audio_in = $18, supports_video_in = $19,
    supports_web_search = $20, output_media_type = $21, cache_shaping = $22, cache_ttl = $23,
    version = version + 1, updated_at = now()
WHERE id = $1
RETURNING id
"""
SET_MODEL_STATUS = """
UPDATE models SET status = $2, blocked = $3, version = version + 1, updated_at = now() WHERE id = $1
"""
PROVIDER_ID_BY_NAME = "SELECT id FROM providers WHERE name = $1"
UPDATE_PROVIDER = """
UPDATE providers SET family = $2, base_url = $3, encrypted_api_key = $4, key_nonce = $5, local = $6,
    max_outbound_rps = $7, max_concurrent_upstream = $8, max_calls_per_hour = $9, retry_enabled = $10,
    max_retries = $11, retry_backoff_ms = $12, log_requests = $13, supports_web_search = $14,
    settings = $15::jsonb, version = version + 1, updated_at = now()
WHERE id = $1
RETURNING
id, name, family, base_url, local, max_outbound_rps, max_concurrent_upstream, max_calls_per_hour,
retry_enabled, max_retries, retry_backoff_ms, log_requests, supports_web_search, settings, version,
created_at, updated_at
"""

INSERT_DEPLOYMENT = """
INSERT INTO model_deployments (model_id, provider_id, resolved_model, region, priority)
VALUES ($1, $2, $3, $4, $5)
RETURNING id
"""
UPSERT_DEPLOYMENT = """
INSERT INTO model_deployments (model_id, provider_id, resolved_model, region, priority)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (model_id, provider_id, resolved_model) DO UPDATE SET
    region = EXCLUDED.region, priority = EXCLUDED.priority
RETURNING id
"""
GET_DEPLOYMENT = """
SELECT
d.id, d.model_id, d.provider_id, p.name AS provider_name, d.resolved_model, d.region, d.priority,
d.created_at
FROM model_deployments d JOIN providers p ON p.id = d.provider_id
WHERE d.id = $1
"""
LIST_DEPLOYMENTS = """
SELECT
d.id, d.model_id, d.provider_id, p.name AS provider_name, d.resolved_model, d.region, d.priority,
d.created_at
FROM model_deployments d JOIN providers p ON p.id = d.provider_id
WHERE d.model_id = $1 ORDER BY d.priority, d.created_at, d.id
"""
LIST_ALL_DEPLOYMENTS = """
SELECT
d.id, d.model_id, d.provider_id, p.name AS provider_name, d.resolved_model, d.region, d.priority,
d.created_at
FROM model_deployments d JOIN providers p ON p.id = d.provider_id
ORDER BY d.model_id, d.priority, d.created_at, d.id
"""
DELETE_DEPLOYMENT = "DELETE FROM model_deployments WHERE id = $1 AND model_id = $2 RETURNING id"
DELETE_OTHER_DEPLOYMENTS = "DELETE FROM model_deployments WHERE model_id = $1 AND NOT (id = ANY($2::uuid[]))"
PROVIDER_EXISTS = "SELECT 1 FROM providers WHERE id = $1"

# --- access and policies ---------------------------------------------------------------------

GRANT_ACCESS = """
INSERT INTO user_model_access (user_id, model_id) VALUES ($1, $2) ON CONFLICT DO NOTHING
"""
REVOKE_ACCESS = "DELETE FROM user_model_access WHERE user_id = $1 AND model_id = $2"
LIST_ACCESS = """
SELECT m.id AS model_id, m.name AS model_name, p.name AS provider_name, a.granted_at
FROM user_model_access a JOIN models m ON m.id = a.model_id JOIN providers p ON p.id = m.provider_id
WHERE a.user_id = $1 ORDER BY m.name
"""
USER_EXISTS = "SELECT 1 FROM users WHERE id = $1 AND kind = 'user'"
PRINCIPAL_EXISTS = "SELECT 1 FROM users WHERE id = $1 AND kind = $2"
MODEL_EXISTS = "SELECT 1 FROM models WHERE id = $1"
UPSERT_POLICY = """
INSERT INTO user_model_policies (user_id, model_id, daily_cap_usd, max_calls_per_hour, allowed_from,
    allowed_to, timezone, active_days, always_open)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
ON CONFLICT (user_id, model_id) DO UPDATE SET
    daily_cap_usd = EXCLUDED.daily_cap_usd, max_calls_per_hour = EXCLUDED.max_calls_per_hour,
    allowed_from = EXCLUDED.allowed_from, allowed_to = EXCLUDED.allowed_to,
    timezone = EXCLUDED.timezone, active_days = EXCLUDED.active_days,
    always_open = EXCLUDED.always_open, updated_at = now()
"""
LIST_POLICIES = """
SELECT a.model_id, m.name AS model_name,
       COALESCE(p.daily_cap_usd, 20.00) AS daily_cap_usd, p.max_calls_per_hour,
       p.allowed_from, p.allowed_to, COALESCE(p.timezone, 'UTC') AS timezone,
       COALESCE(p.active_days, '{0,1,2,3,4,5,6}') AS active_days,
       COALESCE(p.always_open, false) AS always_open
FROM user_model_access a
JOIN models m ON m.id = a.model_id
LEFT JOIN user_model_policies p ON p.user_id = a.user_id AND p.model_id = a.model_id
WHERE a.user_id = $1 ORDER BY m.name
"""

# --- gateway state ---------------------------------------------------------------------------

SET_KILL_SWITCH = "UPDATE gateway_state SET kill_switch = $1, updated_at = now() RETURNING kill_switch"

# --- maintenance (leader) --------------------------------------------------------------------

ENSURE_LOG_PARTITIONS = "SELECT meshfast_ensure_log_partitions($1)"

# --- registry files: owners, models and grants -----------------------------------------------

USER_IDS_BY_EMAIL = "SELECT email, id FROM users WHERE kind = 'user' AND email = ANY($1::text[])"
MODEL_IDS_BY_NAME = "SELECT name, id FROM models WHERE name = ANY($1::text[])"
# Returns 1 when the grant is new, nothing when it was there.
GRANT_ACCESS_IF_NEW = """
INSERT INTO user_model_access (user_id, model_id) VALUES ($1, $2) ON CONFLICT DO NOTHING RETURNING 1
"""

# --- the database's clock --------------------------------------------------------------------

NOW = "SELECT now()"
NOW_PLUS_SECONDS = "SELECT now() + make_interval(secs => $1)"

# --- provider and model renames (a name is unique: a clash is reported as such) ------------

PROVIDER_FOR_UPDATE = "SELECT version, encrypted_api_key, key_nonce FROM providers WHERE id = $1 FOR UPDATE"
RENAME_PROVIDER = "UPDATE providers SET name = $2 WHERE id = $1"
MODEL_FOR_UPDATE = "SELECT version, name FROM models WHERE id = $1 FOR UPDATE"
RENAME_MODEL = "UPDATE models SET name = $2 WHERE id = $1"
# {"dropped": ..., ...} as JSON text: what retention removed, older than $1 days.
RETENTION = "SELECT meshfast_retention($1)::text"
# The leader lock: one worker at a time leads (session-level, held while its connection lives).
TRY_LEADER_LOCK = "SELECT pg_try_advisory_lock($1)"
# A session-level setting; SET takes no parameters, set_config does ($1: the value as text).
SET_STATEMENT_TIMEOUT = "SELECT set_config('statement_timeout', $1, false)"

# --- health ----------------------------------------------------------------------------------

PING = "SELECT 1"

# --- time zones ------------------------------------------------------------------------------

TIMEZONE_NAMES = "SELECT name FROM pg_timezone_names"

# --- principals ------------------------------------------------------------------------------

USER_ID_TEXT_BY_EMAIL = "SELECT id::text FROM users WHERE email = $1 AND kind = 'user'"
