-- Context signals (issue "ecosystem", item 5): a row records the tools the caller declared (each
-- name once, with the size of its definition in bytes) and the tools the model called, so the
-- platform sees which tools callers keep declaring and models never call, and what removing them
-- would save per request.
--
-- ALTER ... ADD COLUMN appends, in the same order on both tables, so the ingest's
-- `INSERT INTO request_logs SELECT * FROM batch` still lines the columns up.
ALTER TABLE request_logs
    ADD COLUMN tools_declared text[],
    ADD COLUMN tools_declared_bytes integer[],
    ADD COLUMN tools_invoked text[],
    ADD COLUMN cache_write_1h_tokens bigint NOT NULL DEFAULT 0;
ALTER TABLE request_logs_ingest
    ADD COLUMN tools_declared text[],
    ADD COLUMN tools_declared_bytes integer[],
    ADD COLUMN tools_invoked text[],
    ADD COLUMN cache_write_1h_tokens bigint NOT NULL DEFAULT 0;

-- Prompt-cache shaping (issue "ecosystem", item 1): on by default per model; `cache_ttl` is the
-- TTL of the breakpoints placed for an Anthropic upstream. A row keeps its one-hour cache writes
-- apart (cache_write_tokens counts both TTLs), and the hourly rollups sum the cache classes, so
-- summaries report reads, writes and the hit rate.
ALTER TABLE models
    ADD COLUMN cache_shaping boolean NOT NULL DEFAULT true,
    ADD COLUMN cache_ttl text NOT NULL DEFAULT '5m' CHECK (cache_ttl IN ('5m', '1h'));
ALTER TABLE request_rollup_hourly
    ADD COLUMN cache_read_tokens bigint NOT NULL DEFAULT 0,
    ADD COLUMN cache_write_tokens bigint NOT NULL DEFAULT 0,
    ADD COLUMN cache_write_1h_tokens bigint NOT NULL DEFAULT 0;
ALTER TABLE request_rollup_hourly_all
    ADD COLUMN cache_read_tokens bigint NOT NULL DEFAULT 0,
    ADD COLUMN cache_write_tokens bigint NOT NULL DEFAULT 0,
    ADD COLUMN cache_write_1h_tokens bigint NOT NULL DEFAULT 0;

-- Hour x user x model x tool: how many calls declared the tool, how many called it, and the
-- definition bytes summed over the declaring calls (bytes / declared_calls: its average size).
CREATE TABLE tool_rollup_hourly (
    hour              timestamptz NOT NULL,
    user_id           uuid,
    model_id          uuid,
    tool              text NOT NULL,
    declared_calls    bigint NOT NULL,
    invoked_calls     bigint NOT NULL,
    definition_bytes  bigint NOT NULL
);
CREATE UNIQUE INDEX tool_rollup_hourly_key ON tool_rollup_hourly (hour, user_id, model_id, tool) NULLS NOT DISTINCT;
CREATE INDEX tool_rollup_hourly_user ON tool_rollup_hourly (user_id, hour);
-- Written only by the ingest trigger (definer's rights); the admin plane reads it and retention
-- deletes from it, as the other rollups (migration 0007).
ALTER TABLE tool_rollup_hourly ENABLE ROW LEVEL SECURITY;
ALTER TABLE tool_rollup_hourly FORCE ROW LEVEL SECURITY;
CREATE POLICY admin_read ON tool_rollup_hourly FOR SELECT TO meshfast_admin USING (true);
CREATE POLICY admin_delete ON tool_rollup_hourly FOR DELETE TO meshfast_admin USING (true);
GRANT SELECT, DELETE ON tool_rollup_hourly TO meshfast_admin;

-- The ingest function of migration 0016, with the tools carried into tool_rollup_hourly and the
-- cache classes into the hourly rollups.
CREATE OR REPLACE FUNCTION meshfast_ingest_request_logs() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public AS $$
BEGIN
    -- One statement: every data-modifying CTE runs, each reading the same inserted rows.
    WITH inserted AS (
        INSERT INTO request_logs SELECT * FROM batch ON CONFLICT DO NOTHING
        RETURNING created_at, user_id, model_id, model_name, provider_id, route, outcome, status_code, deny_reason,
                  count, tokens_in, tokens_out, input_cost, output_cost, latency_ms,
                  business_unit, manager_id, tier, tags, tools_declared, tools_declared_bytes, tools_invoked,
                  cache_read_tokens, cache_write_tokens, cache_write_1h_tokens
    ), tools AS (
        -- A successful call counts once per tool it declared, and once more per declared tool the
        -- model called (a failed call gave the model no chance; an undeclared name is not counted,
        -- so invoked_calls <= declared_calls).
        INSERT INTO tool_rollup_hourly AS r
            (hour, user_id, model_id, tool, declared_calls, invoked_calls, definition_bytes)
        SELECT date_trunc('hour', created_at), user_id, model_id, tool, sum(declared), sum(invoked), sum(bytes)
        FROM (
            SELECT i.created_at, i.user_id, i.model_id, d.tool, 1 AS declared, 0 AS invoked,
                   coalesce(d.bytes, 0)::bigint AS bytes
            FROM inserted i CROSS JOIN LATERAL unnest(i.tools_declared, i.tools_declared_bytes) AS d (tool, bytes)
            WHERE d.tool IS NOT NULL AND i.outcome = 'success'
            UNION ALL
            SELECT i.created_at, i.user_id, i.model_id, v.tool, 0, 1, 0
            FROM inserted i CROSS JOIN LATERAL unnest(i.tools_invoked) AS v (tool)
            WHERE i.outcome = 'success' AND v.tool = ANY (i.tools_declared)
        ) AS t
        GROUP BY 1, 2, 3, 4
        ON CONFLICT (hour, user_id, model_id, tool)
    DO UPDATE SET declared_calls = r.declared_calls + EXCLUDED.declared_calls,
                  invoked_calls = r.invoked_calls + EXCLUDED.invoked_calls,
                  definition_bytes = r.definition_bytes + EXCLUDED.definition_bytes
        RETURNING 1
    ), hourly AS (
        INSERT INTO request_rollup_hourly AS r
            (hour, user_id, model_id, model_name, provider_id, route, outcome, status_code, deny_reason,
             rows, calls, tokens_in, tokens_out, input_cost, output_cost, latency_ms,
             lat_100, lat_500, lat_1000, lat_5000, lat_30000, lat_slower,
             business_unit, manager_id, tier, tags, org_key, cache_read_tokens, cache_write_tokens,
             cache_write_1h_tokens)
        SELECT date_trunc('hour', created_at), user_id, model_id, model_name, provider_id, route, outcome, status_code,
               deny_reason, count(*), sum(count), sum(tokens_in), sum(tokens_out), sum(input_cost), sum(output_cost),
           sum(latency_ms::bigint * count),
           coalesce(sum(count) FILTER (WHERE latency_ms < 100), 0),
           coalesce(sum(count) FILTER (WHERE latency_ms >= 100 AND latency_ms < 500), 0),
           coalesce(sum(count) FILTER (WHERE latency_ms >= 500 AND latency_ms < 1000), 0),
           coalesce(sum(count) FILTER (WHERE latency_ms >= 1000 AND latency_ms < 5000), 0),
           coalesce(sum(count) FILTER (WHERE latency_ms >= 5000 AND latency_ms < 30000), 0),
           coalesce(sum(count) FILTER (WHERE latency_ms >= 30000), 0),
           business_unit, manager_id, tier, tags,
           CASE WHEN business_unit IS NULL AND tier IS NULL AND tags IS NULL THEN NULL
                ELSE md5(jsonb_build_array(business_unit, tier, tags)::text) END,
           sum(cache_read_tokens), sum(cache_write_tokens), sum(cache_write_1h_tokens)
        FROM inserted
        GROUP BY 1, 2, 3, 4, 5, 6, 7, 8, 9, business_unit, manager_id, tier, tags
        ON CONFLICT (hour, user_id, model_id, model_name, provider_id, route, outcome, status_code, deny_reason,
                     manager_id, org_key)
    DO UPDATE SET rows = r.rows + EXCLUDED.rows, calls = r.calls + EXCLUDED.calls,
                  tokens_in = r.tokens_in + EXCLUDED.tokens_in, tokens_out = r.tokens_out + EXCLUDED.tokens_out,
                  input_cost = r.input_cost + EXCLUDED.input_cost, output_cost = r.output_cost + EXCLUDED.output_cost,
                  latency_ms = r.latency_ms + EXCLUDED.latency_ms, lat_100 = r.lat_100 + EXCLUDED.lat_100,
                  lat_500 = r.lat_500 + EXCLUDED.lat_500, lat_1000 = r.lat_1000 + EXCLUDED.lat_1000,
                  lat_5000 = r.lat_5000 + EXCLUDED.lat_5000, lat_30000 = r.lat_30000 + EXCLUDED.lat_30000,
                  lat_slower = r.lat_slower + EXCLUDED.lat_slower,
                  cache_read_tokens = r.cache_read_tokens + EXCLUDED.cache_read_tokens,
                  cache_write_tokens = r.cache_write_tokens + EXCLUDED.cache_write_tokens,
                  cache_write_1h_tokens = r.cache_write_1h_tokens + EXCLUDED.cache_write_1h_tokens
        RETURNING 1
    ), hourly_all AS (
        INSERT INTO request_rollup_hourly_all AS r
            (hour, model_id, model_name, provider_id, route, outcome, status_code, deny_reason,
             rows, calls, tokens_in, tokens_out, input_cost, output_cost, latency_ms,
             lat_100, lat_500, lat_1000, lat_5000, lat_30000, lat_slower,
             cache_read_tokens, cache_write_tokens, cache_write_1h_tokens)
        SELECT date_trunc('hour', created_at), model_id, model_name, provider_id, route, outcome, status_code,
               deny_reason, count(*), sum(count), sum(tokens_in), sum(tokens_out), sum(input_cost), sum(output_cost),
           sum(latency_ms::bigint * count),
           coalesce(sum(count) FILTER (WHERE latency_ms < 100), 0),
           coalesce(sum(count) FILTER (WHERE latency_ms >= 100 AND latency_ms < 500), 0),
           coalesce(sum(count) FILTER (WHERE latency_ms >= 500 AND latency_ms < 1000), 0),
           coalesce(sum(count) FILTER (WHERE latency_ms >= 1000 AND latency_ms < 5000), 0),
           coalesce(sum(count) FILTER (WHERE latency_ms >= 5000 AND latency_ms < 30000), 0),
           coalesce(sum(count) FILTER (WHERE latency_ms >= 30000), 0),
           sum(cache_read_tokens), sum(cache_write_tokens), sum(cache_write_1h_tokens)
        FROM inserted
        GROUP BY 1, 2, 3, 4, 5, 6, 7, 8
        ON CONFLICT (hour, model_id, model_name, provider_id, route, outcome, status_code, deny_reason)
    DO UPDATE SET rows = r.rows + EXCLUDED.rows, calls = r.calls + EXCLUDED.calls,
                  tokens_in = r.tokens_in + EXCLUDED.tokens_in, tokens_out = r.tokens_out + EXCLUDED.tokens_out,
                  input_cost = r.input_cost + EXCLUDED.input_cost, output_cost = r.output_cost + EXCLUDED.output_cost,
                  latency_ms = r.latency_ms + EXCLUDED.latency_ms, lat_100 = r.lat_100 + EXCLUDED.lat_100,
                  lat_500 = r.lat_500 + EXCLUDED.lat_500, lat_1000 = r.lat_1000 + EXCLUDED.lat_1000,
                  lat_5000 = r.lat_5000 + EXCLUDED.lat_5000, lat_30000 = r.lat_30000 + EXCLUDED.lat_30000,
                  lat_slower = r.lat_slower + EXCLUDED.lat_slower,
                  cache_read_tokens = r.cache_read_tokens + EXCLUDED.cache_read_tokens,
                  cache_write_tokens = r.cache_write_tokens + EXCLUDED.cache_write_tokens,
                  cache_write_1h_tokens = r.cache_write_1h_tokens + EXCLUDED.cache_write_1h_tokens
        RETURNING 1
    )
    INSERT INTO request_rollup_daily_user AS r
    SELECT (created_at AT TIME ZONE 'UTC')::date, user_id, outcome, count(*), sum(count), sum(tokens_in),
           sum(tokens_out), sum(input_cost), sum(output_cost)
    FROM inserted
    GROUP BY 1, 2, 3
    ON CONFLICT (day, user_id, outcome)
    DO UPDATE SET rows = r.rows + EXCLUDED.rows, calls = r.calls + EXCLUDED.calls,
                  tokens_in = r.tokens_in + EXCLUDED.tokens_in, tokens_out = r.tokens_out + EXCLUDED.tokens_out,
                  input_cost = r.input_cost + EXCLUDED.input_cost, output_cost = r.output_cost + EXCLUDED.output_cost;
    -- Only this transaction's rows are visible (committed batches are already gone).
    DELETE FROM request_logs_ingest;
    RETURN NULL;
END;
$$;
REVOKE ALL ON FUNCTION meshfast_ingest_request_logs() FROM PUBLIC;

-- Retention (migration 0008) deletes the tool rollup's old hours too.
CREATE OR REPLACE FUNCTION meshfast_retention(days integer) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public AS $$
DECLARE
    cutoff date := (now() AT TIME ZONE 'UTC')::date - days;
    part record;
    dropped integer := 0;
    rollup_rows bigint := 0;
    n bigint;
    sessions bigint;
BEGIN
    IF days < 1 THEN
        RAISE EXCEPTION 'retention must keep at least one day';
    END IF;
    FOR part IN
        SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
        WHERE i.inhparent = 'request_logs'::regclass AND c.relname ~ '^request_logs_[0-9]{8}$'
          AND to_date(substr(c.relname, 14), 'YYYYMMDD') < cutoff
    LOOP
        EXECUTE format('DROP TABLE %I', part.relname);
        dropped := dropped + 1;
    END LOOP;
    -- Rows that fell into the default partition are deleted the slow way.
    DELETE FROM request_logs_default WHERE created_at < cutoff::timestamp AT TIME ZONE 'UTC';
    DELETE FROM request_rollup_hourly WHERE hour < cutoff::timestamp AT TIME ZONE 'UTC';
    GET DIAGNOSTICS n = ROW_COUNT;
    rollup_rows := rollup_rows + n;
    DELETE FROM request_rollup_hourly_all WHERE hour < cutoff::timestamp AT TIME ZONE 'UTC';
    GET DIAGNOSTICS n = ROW_COUNT;
    rollup_rows := rollup_rows + n;
    DELETE FROM request_rollup_daily_user WHERE day < cutoff;
    GET DIAGNOSTICS n = ROW_COUNT;
    rollup_rows := rollup_rows + n;
    DELETE FROM tool_rollup_hourly WHERE hour < cutoff::timestamp AT TIME ZONE 'UTC';
    GET DIAGNOSTICS n = ROW_COUNT;
    rollup_rows := rollup_rows + n;
    DELETE FROM admin_sessions WHERE expires_at <= now();
    GET DIAGNOSTICS sessions = ROW_COUNT;
    -- Idempotency keys (migration 0009) are kept a day.
    DELETE FROM admin_idempotency WHERE created_at < now() - interval '24 hours';
    RETURN jsonb_build_object('partitions_dropped', dropped, 'rollup_rows_deleted', rollup_rows,
                              'sessions_deleted', sessions);
END;
$$;

REVOKE ALL ON FUNCTION meshfast_retention(integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION meshfast_retention(integer) TO meshfast_gateway;
