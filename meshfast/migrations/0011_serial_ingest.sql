-- Concurrent ingest batches (one COPY per worker) could deadlock on the rollup upserts; the
-- ingest trigger now takes a transaction-scoped advisory lock first, so batches run one at a time.
-- CREATE OR REPLACE keeps the function's owner and grants.
CREATE OR REPLACE FUNCTION meshfast_ingest_request_logs() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public AS $$
BEGIN
    -- Batches from different workers take turns: each upserts many rollup rows, in an order no
    -- two batches share, so two at once could lock each other's rows crosswise (a deadlock that
    -- would fail the COPY). One batch is milliseconds of work; the wait is short.
    PERFORM pg_advisory_xact_lock(hashtext('meshfast_ingest_request_logs'));
    -- One statement: every data-modifying CTE runs, each reading the same inserted rows.
    WITH inserted AS (
        INSERT INTO request_logs SELECT * FROM batch ON CONFLICT DO NOTHING
        RETURNING created_at, user_id, model_id, model_name, provider_id, route, outcome, status_code, deny_reason,
                  count, tokens_in, tokens_out, input_cost, output_cost, latency_ms
    ), hourly AS (
        INSERT INTO request_rollup_hourly AS r
        SELECT date_trunc('hour', created_at), user_id, model_id, model_name, provider_id, route, outcome, status_code,
               deny_reason, count(*), sum(count), sum(tokens_in), sum(tokens_out), sum(input_cost), sum(output_cost),
           sum(latency_ms::bigint * count),
           coalesce(sum(count) FILTER (WHERE latency_ms < 100), 0),
           coalesce(sum(count) FILTER (WHERE latency_ms >= 100 AND latency_ms < 500), 0),
           coalesce(sum(count) FILTER (WHERE latency_ms >= 500 AND latency_ms < 1000), 0),
           coalesce(sum(count) FILTER (WHERE latency_ms >= 1000 AND latency_ms < 5000), 0),
           coalesce(sum(count) FILTER (WHERE latency_ms >= 5000 AND latency_ms < 30000), 0),
           coalesce(sum(count) FILTER (WHERE latency_ms >= 30000), 0)
        FROM inserted
        GROUP BY 1, 2, 3, 4, 5, 6, 7, 8, 9
        ON CONFLICT (hour, user_id, model_id, model_name, provider_id, route, outcome, status_code, deny_reason)
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
