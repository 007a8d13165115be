-- Chargeback (issue 14, item 8): a request row keeps the caller's organisation as it was at call
-- time (business unit, manager, tier), the shadow rule that would have refused it (would_deny) and
-- the tags its model had (a row counts once per tag in a grouping by tag).
--
-- The per-user hourly rollup gains the same dimensions, so /admin/logs/summary?group_by= reads
-- the rollup, not the rows, and its totals are the exact sums of the rows' costs. The three text
-- dimensions are not index keys (a business unit, a tier and a model's tags could together pass
-- the ~2.7 kB a unique index entry holds): their md5 (org_key) is, and equal keys mean equal
-- values, so an upsert never mixes two organisations in one rollup row.

-- ALTER ... ADD COLUMN appends, in the same order on both tables, so the ingest's
-- `INSERT INTO request_logs SELECT * FROM batch` still lines the columns up.
ALTER TABLE request_logs
    ADD COLUMN business_unit text,
    ADD COLUMN manager_id uuid,
    ADD COLUMN tier text,
    ADD COLUMN would_deny text,
    ADD COLUMN tags text[];
ALTER TABLE request_logs_ingest
    ADD COLUMN business_unit text,
    ADD COLUMN manager_id uuid,
    ADD COLUMN tier text,
    ADD COLUMN would_deny text,
    ADD COLUMN tags text[];

ALTER TABLE request_rollup_hourly
    ADD COLUMN business_unit text,
    ADD COLUMN manager_id uuid,
    ADD COLUMN tier text,
    ADD COLUMN tags text[],
    -- NULL when the three are NULL (every rollup row written before this migration).
    ADD COLUMN org_key text;
DROP INDEX request_rollup_hourly_key;
CREATE UNIQUE INDEX request_rollup_hourly_key ON request_rollup_hourly
    (hour, user_id, model_id, model_name, provider_id, route, outcome, status_code, deny_reason, manager_id, org_key)
    NULLS NOT DISTINCT;

-- The ingest function of migration 0007, with the organisation carried into the hourly rollup.
CREATE OR REPLACE FUNCTION meshfast_ingest_request_logs() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public AS $$
BEGIN
    -- One statement: every data-modifying CTE runs, each reading the same inserted rows.
    WITH inserted AS (
        INSERT INTO request_logs SELECT * FROM batch ON CONFLICT DO NOTHING
        RETURNING created_at, user_id, model_id, model_name, provider_id, route, outcome, status_code, deny_reason,
                  count, tokens_in, tokens_out, input_cost, output_cost, latency_ms,
                  business_unit, manager_id, tier, tags
    ), hourly AS (
        INSERT INTO request_rollup_hourly AS r
            (hour, user_id, model_id, model_name, provider_id, route, outcome, status_code, deny_reason,
             rows, calls, tokens_in, tokens_out, input_cost, output_cost, latency_ms,
             lat_100, lat_500, lat_1000, lat_5000, lat_30000, lat_slower,
             business_unit, manager_id, tier, tags, org_key)
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
                ELSE md5(jsonb_build_array(business_unit, tier, tags)::text) END
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
                  lat_slower = r.lat_slower + EXCLUDED.lat_slower
        RETURNING 1
    ), hourly_all AS (
        INSERT INTO request_rollup_hourly_all AS r
        SELECT date_trunc('hour', created_at), model_id, model_name, provider_id, route, outcome, status_code,
               deny_reason, count(*), sum(count), sum(tokens_in), sum(tokens_out), sum(input_cost), sum(output_cost),
           sum(latency_ms::bigint * count),
           coalesce(sum(count) FILTER (WHERE latency_ms < 100), 0),
           coalesce(sum(count) FILTER (WHERE latency_ms >= 100 AND latency_ms < 500), 0),
           coalesce(sum(count) FILTER (WHERE latency_ms >= 500 AND latency_ms < 1000), 0),
           coalesce(sum(count) FILTER (WHERE latency_ms >= 1000 AND latency_ms < 5000), 0),
           coalesce(sum(count) FILTER (WHERE latency_ms >= 5000 AND latency_ms < 30000), 0),
           coalesce(sum(count) FILTER (WHERE latency_ms >= 30000), 0)
        FROM inserted
        GROUP BY 1, 2, 3, 4, 5, 6, 7, 8
        ON CONFLICT (hour, model_id, model_name, provider_id, route, outcome, status_code, deny_reason)
    DO UPDATE SET rows = r.rows + EXCLUDED.rows, calls = r.calls + EXCLUDED.calls,
                  tokens_in = r.tokens_in + EXCLUDED.tokens_in, tokens_out = r.tokens_out + EXCLUDED.tokens_out,
                  input_cost = r.input_cost + EXCLUDED.input_cost, output_cost = r.output_cost + EXCLUDED.output_cost,
                  latency_ms = r.latency_ms + EXCLUDED.latency_ms, lat_100 = r.lat_100 + EXCLUDED.lat_100,
                  lat_500 = r.lat_500 + EXCLUDED.lat_500, lat_1000 = r.lat_1000 + EXCLUDED.lat_1000,
                  lat_5000 = r.lat_5000 + EXCLUDED.lat_5000, lat_30000 = r.lat_30000 + EXCLUDED.lat_30000,
                  lat_slower = r.lat_slower + EXCLUDED.lat_slower
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
