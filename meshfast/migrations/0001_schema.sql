-- meshfast schema: configuration, counters, audit and day-partitioned request logs.
-- The roles meshfast_admin and meshfast_gateway exist before this runs (the migration
-- runner creates them); every table forces row-level security with one policy per role.

CREATE SEQUENCE meshfast_config_seq;

CREATE TABLE admins (
    id                    uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    email                 text NOT NULL UNIQUE,
    password_hash         text NOT NULL,
    status                text NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'paused')),
    is_super              boolean NOT NULL DEFAULT false,
    created_by            text NOT NULL,
    failed_login_attempts integer NOT NULL DEFAULT 0,
    locked_until          timestamptz,
    created_at            timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE admin_sessions (
    id          uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    admin_id    uuid NOT NULL REFERENCES admins (id) ON DELETE CASCADE,
    token_hash  text NOT NULL UNIQUE,
    csrf_hash   text NOT NULL,
    expires_at  timestamptz NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX admin_sessions_expires_idx ON admin_sessions (expires_at);

-- Bearer tokens for automation. The bootstrap token (MESHFAST_ADMIN_TOKEN or generated on
-- first start) is the row named 'bootstrap'; it carries super-admin rights.
CREATE TABLE admin_tokens (
    id          uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    name        text NOT NULL,
    token_hash  text NOT NULL UNIQUE,
    is_super    boolean NOT NULL DEFAULT false,
    created_by  text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    revoked_at  timestamptz
);
CREATE UNIQUE INDEX admin_tokens_bootstrap_idx ON admin_tokens (name)
    WHERE name = 'bootstrap' AND revoked_at IS NULL;

CREATE TABLE users (
    id             uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    email          text NOT NULL UNIQUE,
    display_name   text NOT NULL,
    manager_email  text,
    business_unit  text,
    tier           text,
    status         text NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'revoked')),
    expires_at     timestamptz,
    created_at     timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE mesh_api_keys (
    id          uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    user_id     uuid NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    -- SHA-256(pepper || token): 32 raw bytes.
    key_hash    bytea NOT NULL UNIQUE CHECK (length(key_hash) = 32),
    key_prefix  text NOT NULL,
    status      text NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'revoked')),
    expires_at  timestamptz,
    created_at  timestamptz NOT NULL DEFAULT now(),
    revoked_at  timestamptz
);
CREATE UNIQUE INDEX mesh_api_keys_one_active_idx ON mesh_api_keys (user_id) WHERE status = 'active';

CREATE TABLE providers (
    id                       uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    name                     text NOT NULL UNIQUE,
    family                   text NOT NULL
        CHECK (family IN ('openai', 'openai_responses', 'anthropic', 'gemini', 'ollama', 'generic')),
    base_url                 text NOT NULL,
    -- AES-256-GCM under the master key; the provider id is the associated data.
    encrypted_api_key        bytea NOT NULL,
    key_nonce                bytea NOT NULL CHECK (length(key_nonce) = 12),
    local                    boolean NOT NULL DEFAULT false,
    max_outbound_rps         integer CHECK (max_outbound_rps IS NULL OR max_outbound_rps > 0),
    max_concurrent_upstream  integer CHECK (max_concurrent_upstream IS NULL OR max_concurrent_upstream > 0),
    max_calls_per_hour       integer CHECK (max_calls_per_hour IS NULL OR max_calls_per_hour > 0),
    retry_enabled            boolean NOT NULL DEFAULT true,
    max_retries              integer NOT NULL DEFAULT 2 CHECK (max_retries >= 0),
    retry_backoff_ms         integer NOT NULL DEFAULT 200 CHECK (retry_backoff_ms >= 0),
    log_requests             boolean NOT NULL DEFAULT true,
    supports_web_search      boolean NOT NULL DEFAULT false,
    -- Family-specific settings (generic templates, dot paths, generation endpoints).
    settings                 jsonb NOT NULL DEFAULT '{}'::jsonb,
    version                  integer NOT NULL DEFAULT 1,
    created_at               timestamptz NOT NULL DEFAULT now(),
    updated_at               timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE models (
    id                                uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    provider_id                       uuid NOT NULL REFERENCES providers (id) ON DELETE CASCADE,
    name                              text NOT NULL UNIQUE,
    resolved_model                    text NOT NULL,
    kind                              text NOT NULL DEFAULT 'chat'
        CHECK (kind IN ('chat', 'embedding', 'image_generation', 'video_generation')),
    status                            text NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'retired')),
    blocked                           boolean NOT NULL DEFAULT false,
    input_price_per_1k_tokens         numeric(16, 9) NOT NULL DEFAULT 0 CHECK (input_price_per_1k_tokens >= 0),
    output_price_per_1k_tokens        numeric(16, 9) NOT NULL DEFAULT 0 CHECK (output_price_per_1k_tokens >= 0),
    cache_read_price_per_1k_tokens    numeric(16, 9),
    cache_write_price_per_1k_tokens   numeric(16, 9),
    cache_write_1h_price_per_1k_tokens numeric(16, 9),
    long_context_threshold_tokens     integer,
    long_context_prices               jsonb,
    price_per_second                  numeric(16, 9) NOT NULL DEFAULT 0,
    max_output_tokens                 integer NOT NULL DEFAULT 4096 CHECK (max_output_tokens > 0),
    aliases                           text[] NOT NULL DEFAULT '{}',
    tags                              text[] NOT NULL DEFAULT '{}',
    supports_image_in                 boolean NOT NULL DEFAULT false,
    supports_document_in              boolean NOT NULL DEFAULT false,
    supports_audio_in                 boolean NOT NULL DEFAULT false,
    supports_video_in                 boolean NOT NULL DEFAULT false,
    supports_web_search               boolean NOT NULL DEFAULT false,
    output_media_type                 text,
    version                           integer NOT NULL DEFAULT 1,
    created_at                        timestamptz NOT NULL DEFAULT now(),
    updated_at                        timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX models_provider_idx ON models (provider_id);

CREATE TABLE model_deployments (
    id              uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    model_id        uuid NOT NULL REFERENCES models (id) ON DELETE CASCADE,
    provider_id     uuid NOT NULL REFERENCES providers (id) ON DELETE CASCADE,
    resolved_model  text NOT NULL,
    region          text,
    priority        integer NOT NULL DEFAULT 100,
    created_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX model_deployments_model_idx ON model_deployments (model_id, priority);

CREATE TABLE user_model_access (
    user_id     uuid NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    model_id    uuid NOT NULL REFERENCES models (id) ON DELETE CASCADE,
    granted_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (user_id, model_id)
);

-- A grant with no row here gets the defaults: $20/day, every day, no window, no hourly cap.
CREATE TABLE user_model_policies (
    user_id             uuid NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    model_id            uuid NOT NULL REFERENCES models (id) ON DELETE CASCADE,
    daily_cap_usd       numeric(12, 2) NOT NULL DEFAULT 20.00 CHECK (daily_cap_usd >= 0),
    max_calls_per_hour  integer CHECK (max_calls_per_hour IS NULL OR max_calls_per_hour >= 1),
    allowed_from        time,
    allowed_to          time,
    timezone            text NOT NULL DEFAULT 'UTC',
    active_days         integer[] NOT NULL DEFAULT '{0,1,2,3,4,5,6}',
    always_open         boolean NOT NULL DEFAULT false,
    updated_at          timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (user_id, model_id)
);

CREATE TABLE daily_spend (
    user_id         uuid NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    model_id        uuid NOT NULL REFERENCES models (id) ON DELETE CASCADE,
    day             date NOT NULL,
    spend_nano_usd  bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (user_id, model_id, day)
);

CREATE TABLE provider_hourly_usage (
    provider_id  uuid NOT NULL REFERENCES providers (id) ON DELETE CASCADE,
    hour_start   timestamptz NOT NULL,
    call_count   bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (provider_id, hour_start)
);

CREATE TABLE user_model_hourly_usage (
    user_id      uuid NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    model_id     uuid NOT NULL REFERENCES models (id) ON DELETE CASCADE,
    hour_start   timestamptz NOT NULL,
    call_count   bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (user_id, model_id, hour_start)
);

-- Cluster-wide gateway state (one row): the kill switch.
CREATE TABLE gateway_state (
    id           boolean PRIMARY KEY DEFAULT true CHECK (id),
    kill_switch  boolean NOT NULL DEFAULT false,
    updated_at   timestamptz NOT NULL DEFAULT now()
);
INSERT INTO gateway_state DEFAULT VALUES;

CREATE TABLE admin_audit_log (
    id          bigserial PRIMARY KEY,
    actor       text NOT NULL,
    action      text NOT NULL,
    target      text,
    detail      jsonb NOT NULL DEFAULT '{}'::jsonb,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX admin_audit_log_created_idx ON admin_audit_log (created_at DESC);
CREATE INDEX admin_audit_log_action_idx ON admin_audit_log (action, created_at DESC);

-- One row per data-plane POST, denials included. Partitioned by day so retention drops
-- whole partitions; the default partition catches anything outside the prepared range.
CREATE TABLE request_logs (
    id                 uuid NOT NULL,
    request_id         text NOT NULL,
    created_at         timestamptz NOT NULL,
    mesh_key_id        uuid,
    user_id            uuid,
    provider_id        uuid,
    model_id           uuid,
    model_name         text,
    requested_model    text,
    route              text,
    outcome            text NOT NULL CHECK (outcome IN ('success', 'upstream_error', 'denied')),
    deny_reason        text,
    status_code        integer NOT NULL,
    latency_ms         integer NOT NULL DEFAULT 0,
    ttfb_ms            integer,
    tokens_in          bigint NOT NULL DEFAULT 0,
    tokens_out         bigint NOT NULL DEFAULT 0,
    cache_read_tokens  bigint NOT NULL DEFAULT 0,
    cache_write_tokens bigint NOT NULL DEFAULT 0,
    usage_estimated    boolean NOT NULL DEFAULT false,
    input_cost         numeric(16, 9) NOT NULL DEFAULT 0,
    output_cost        numeric(16, 9) NOT NULL DEFAULT 0,
    web_searches       integer NOT NULL DEFAULT 0,
    generated_seconds  numeric(10, 2),
    source_ip          inet,
    user_agent         text,
    browser            text,
    browser_version    text,
    os                 text,
    os_version         text,
    device_type        text,
    count              integer NOT NULL DEFAULT 1 CHECK (count >= 1),
    PRIMARY KEY (id, created_at)
) PARTITION BY RANGE (created_at);

CREATE TABLE request_logs_default PARTITION OF request_logs DEFAULT;

CREATE INDEX request_logs_created_idx ON request_logs (created_at DESC);
CREATE INDEX request_logs_user_idx ON request_logs (user_id, created_at DESC);
CREATE INDEX request_logs_provider_idx ON request_logs (provider_id, created_at DESC);
CREATE INDEX request_logs_key_idx ON request_logs (mesh_key_id, created_at DESC);
CREATE INDEX request_logs_outcome_idx ON request_logs (outcome, created_at DESC);
CREATE INDEX request_logs_user_model_idx ON request_logs (user_id, model_id, created_at DESC);
CREATE INDEX request_logs_request_id_idx ON request_logs (request_id);

-- Creates the daily partitions from today (UTC) through today + days_ahead. Runs with the
-- definer's rights so the leader can call it from the gateway role.
CREATE FUNCTION meshfast_ensure_log_partitions(days_ahead integer) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public AS $$
DECLARE
    d date := (now() AT TIME ZONE 'UTC')::date;
    part text;
    created integer := 0;
BEGIN
    FOR i IN 0 .. days_ahead LOOP
        part := format('request_logs_%s', to_char(d + i, 'YYYYMMDD'));
        IF to_regclass(part) IS NULL THEN
            EXECUTE format(
                'CREATE TABLE %I PARTITION OF request_logs FOR VALUES FROM (%L) TO (%L)',
                part, (d + i)::timestamp AT TIME ZONE 'UTC', (d + i + 1)::timestamp AT TIME ZONE 'UTC');
            EXECUTE format('ALTER TABLE %I ENABLE ROW LEVEL SECURITY', part);
            EXECUTE format('ALTER TABLE %I FORCE ROW LEVEL SECURITY', part);
            created := created + 1;
        END IF;
    END LOOP;
    RETURN created;
END;
$$;
-- NOTE: a default partition holding rows for a new day's range blocks creating that
-- partition; rows only land there when partitions were not prepared, and the leader
-- prepares them days ahead.
SELECT meshfast_ensure_log_partitions(7);

-- Row-level security: enabled and forced everywhere, one permissive policy per role.
DO $$
DECLARE
    t text;
BEGIN
    FOREACH t IN ARRAY ARRAY[
        'admins', 'admin_sessions', 'admin_tokens', 'users', 'mesh_api_keys', 'providers', 'models',
        'model_deployments', 'user_model_access', 'user_model_policies', 'daily_spend',
        'provider_hourly_usage', 'user_model_hourly_usage', 'gateway_state', 'admin_audit_log',
        'request_logs', 'request_logs_default'
    ] LOOP
        EXECUTE format('ALTER TABLE %I ENABLE ROW LEVEL SECURITY', t);
        EXECUTE format('ALTER TABLE %I FORCE ROW LEVEL SECURITY', t);
    END LOOP;

    -- Admin plane only.
    FOREACH t IN ARRAY ARRAY['admins', 'admin_sessions', 'admin_tokens'] LOOP
        EXECUTE format('CREATE POLICY admin_all ON %I FOR ALL TO meshfast_admin USING (true) WITH CHECK (true)', t);
        EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON %I TO meshfast_admin', t);
    END LOOP;

    -- Configuration: the admin writes, the gateway reads.
    FOREACH t IN ARRAY ARRAY[
        'users', 'mesh_api_keys', 'providers', 'models', 'model_deployments', 'user_model_access',
        'user_model_policies', 'gateway_state'
    ] LOOP
        EXECUTE format('CREATE POLICY admin_all ON %I FOR ALL TO meshfast_admin USING (true) WITH CHECK (true)', t);
        EXECUTE format('CREATE POLICY gateway_read ON %I FOR SELECT TO meshfast_gateway USING (true)', t);
        EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON %I TO meshfast_admin', t);
        EXECUTE format('GRANT SELECT ON %I TO meshfast_gateway', t);
    END LOOP;

    -- Counters: the gateway writes, the admin reads (and deletes with their owners).
    FOREACH t IN ARRAY ARRAY['daily_spend', 'provider_hourly_usage', 'user_model_hourly_usage'] LOOP
        EXECUTE format('CREATE POLICY admin_read ON %I FOR SELECT TO meshfast_admin USING (true)', t);
        EXECUTE format('CREATE POLICY admin_delete ON %I FOR DELETE TO meshfast_admin USING (true)', t);
        EXECUTE format('CREATE POLICY gateway_read ON %I FOR SELECT TO meshfast_gateway USING (true)', t);
        EXECUTE format('CREATE POLICY gateway_insert ON %I FOR INSERT TO meshfast_gateway WITH CHECK (true)', t);
        EXECUTE format('CREATE POLICY gateway_update ON %I FOR UPDATE TO meshfast_gateway USING (true) WITH CHECK (true)', t);
        EXECUTE format('GRANT SELECT, DELETE ON %I TO meshfast_admin', t);
        EXECUTE format('GRANT SELECT, INSERT, UPDATE ON %I TO meshfast_gateway', t);
    END LOOP;

    -- Request logs: the gateway appends, the admin reads and deletes.
    -- (Partitions keep RLS forced with no policy: they are reached through the parent only.)
    CREATE POLICY admin_read ON request_logs FOR SELECT TO meshfast_admin USING (true);
    CREATE POLICY admin_delete ON request_logs FOR DELETE TO meshfast_admin USING (true);
    CREATE POLICY gateway_append ON request_logs FOR INSERT TO meshfast_gateway WITH CHECK (true);
    GRANT SELECT, DELETE ON request_logs TO meshfast_admin;
    GRANT INSERT ON request_logs TO meshfast_gateway;

    -- Audit: append and read, never rewrite.
    CREATE POLICY admin_append ON admin_audit_log FOR INSERT TO meshfast_admin WITH CHECK (true);
    CREATE POLICY admin_read ON admin_audit_log FOR SELECT TO meshfast_admin USING (true);
    GRANT SELECT, INSERT ON admin_audit_log TO meshfast_admin;
    GRANT USAGE ON SEQUENCE admin_audit_log_id_seq TO meshfast_admin;
END;
$$;

GRANT USAGE, SELECT ON SEQUENCE meshfast_config_seq TO meshfast_admin;
GRANT SELECT ON SEQUENCE meshfast_config_seq TO meshfast_gateway;
GRANT EXECUTE ON FUNCTION meshfast_ensure_log_partitions(integer) TO meshfast_gateway, meshfast_admin;
