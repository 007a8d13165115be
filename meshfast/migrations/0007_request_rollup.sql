-- Rollups of request_logs that the ingest keeps, so summaries over weeks of traffic read
-- thousands of rows instead of millions:
--   request_rollup_hourly      hour x user x model x outcome ...: one user's (or model's) view
--   request_rollup_hourly_all  hour x model x outcome ... (no user): the whole instance's view
--   request_rollup_daily_user  UTC day x user x outcome: spend by person over long windows
--
-- The ingest works a COPY batch at a time: rows land in request_logs_ingest, and one
-- statement-level trigger (with the definer's rights) moves the batch into request_logs
-- (skipping request ids already there: replayed spool rows), adds what was really inserted to
-- the rollups, and deletes the batch. One INSERT ... SELECT per batch replaces one plpgsql call
-- per row. Rows never outlive their own transaction in the ingest table.

CREATE TABLE request_rollup_hourly (
    hour          timestamptz NOT NULL,
    user_id       uuid,
    model_id      uuid,
    model_name    text,
    provider_id   uuid,
    route         text,
    outcome       text NOT NULL,
    status_code   integer NOT NULL,
    deny_reason   text,
    -- Rows (for paging totals) and calls (a merged denial row counts `count` calls).
    rows          bigint NOT NULL,
    calls         bigint NOT NULL,
    tokens_in     bigint NOT NULL,
    tokens_out    bigint NOT NULL,
    input_cost    numeric(20, 9) NOT NULL,
    output_cost   numeric(20, 9) NOT NULL,
    latency_ms    bigint NOT NULL,
    -- Calls by latency: < 100 ms, < 500 ms, < 1 s, < 5 s, < 30 s, longer.
    lat_100       bigint NOT NULL,
    lat_500       bigint NOT NULL,
    lat_1000      bigint NOT NULL,
    lat_5000      bigint NOT NULL,
    lat_30000     bigint NOT NULL,
    lat_slower    bigint NOT NULL
);
-- NULLs are distinct in a plain unique index; the upserts need them equal.
CREATE UNIQUE INDEX request_rollup_hourly_key ON request_rollup_hourly
    (hour, user_id, model_id, model_name, provider_id, route, outcome, status_code, deny_reason) NULLS NOT DISTINCT;
CREATE INDEX request_rollup_hourly_user ON request_rollup_hourly (user_id, hour);
CREATE INDEX request_rollup_hourly_model ON request_rollup_hourly (model_id, hour);

CREATE TABLE request_rollup_hourly_all (LIKE request_rollup_hourly);
ALTER TABLE request_rollup_hourly_all DROP COLUMN user_id;
CREATE UNIQUE INDEX request_rollup_hourly_all_key ON request_rollup_hourly_all
    (hour, model_id, model_name, provider_id, route, outcome, status_code, deny_reason) NULLS NOT DISTINCT;

CREATE TABLE request_rollup_daily_user (
    day          date NOT NULL,
    user_id      uuid,
    outcome      text NOT NULL,
    rows         bigint NOT NULL,
    calls        bigint NOT NULL,
    tokens_in    bigint NOT NULL,
    tokens_out   bigint NOT NULL,
    input_cost   numeric(20, 9) NOT NULL,
    output_cost  numeric(20, 9) NOT NULL
);
CREATE UNIQUE INDEX request_rollup_daily_user_key ON request_rollup_daily_user (day, user_id, outcome) NULLS NOT DISTINCT;

-- Written only by the ingest trigger (definer's rights); the admin plane reads them and
-- retention deletes from them.
DO $$
DECLARE
    t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['request_rollup_hourly', 'request_rollup_hourly_all', 'request_rollup_daily_user'] LOOP
        EXECUTE format('ALTER TABLE %I ENABLE ROW LEVEL SECURITY', t);
        EXECUTE format('ALTER TABLE %I FORCE ROW LEVEL SECURITY', t);
        EXECUTE format('CREATE POLICY admin_read ON %I FOR SELECT TO meshfast_admin USING (true)', t);
        EXECUTE format('CREATE POLICY admin_delete ON %I FOR DELETE TO meshfast_admin USING (true)', t);
        EXECUTE format('GRANT SELECT, DELETE ON %I TO meshfast_admin', t);
    END LOOP;
END;
$$;

CREATE FUNCTION meshfast_ingest_request_logs() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public AS $$
BEGIN
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

DROP TRIGGER request_logs_ingest_route ON request_logs_ingest;
CREATE TRIGGER request_logs_ingest_batch AFTER INSERT ON request_logs_ingest
    REFERENCING NEW TABLE AS batch FOR EACH STATEMENT EXECUTE FUNCTION meshfast_ingest_request_logs();
REVOKE ALL ON FUNCTION meshfast_ingest_request_logs() FROM PUBLIC;

-- What is already in request_logs, counted into the rollups once, by the same function.
CREATE TEMP TABLE meshfast_backfill ON COMMIT DROP AS SELECT * FROM request_logs;
DELETE FROM request_logs;
INSERT INTO request_logs_ingest SELECT * FROM meshfast_backfill;
