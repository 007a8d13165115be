-- Attribution (issue "identity", items 4 and 5): a row keeps the caller's X-Meshfast-Tags as an
-- object (call_tags; the API's `tags`), and the per-user hourly rollup keeps them with the principal
-- kind and the platform token's issuer, so /admin/logs/summary?group_by=platform (any tag key),
-- principal_kind or token_issuer reads the rollup, not the rows. org_key (migration 0016) covers
-- them too: equal keys still mean equal values (rows without them keep the old key).
--
-- ALTER ... ADD COLUMN appends, in the same order on both tables, so the ingest's
-- `INSERT INTO request_logs SELECT * FROM batch` still lines the columns up.
ALTER TABLE request_logs ADD COLUMN call_tags jsonb;
ALTER TABLE request_logs_ingest ADD COLUMN call_tags jsonb;
ALTER TABLE request_rollup_hourly
    ADD COLUMN call_tags jsonb,
    ADD COLUMN principal_kind text,
    ADD COLUMN token_issuer text;

-- The ingest function of migration 0019, with the attribution carried into the hourly rollup.
CREATE OR REPLACE FUNCTION meshfast_ingest_request_logs() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public AS $$
BEGIN
    -- One statement: every data-modifying CTE runs, each reading the same inserted rows.
    WITH inserted AS (
        INSERT INTO request_logs SELECT * FROM batch ON CONFLICT DO NOTHING
        RETURNING created_at, user_id, model_id, model_name, provider_id, route, outcome, status_code, deny_reason,
                  count, tokens_in, tokens_out, input_cost, output_cost, latency_ms,
                  business_unit, manager_id, tier, tags, tools_declared, tools_declared_bytes, tools_invoked,
                  cache_read_tokens, cache_write_tokens, cache_write_1h_tokens, call_tags, principal_kind,
                  token_issuer
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
             cache_write_1h_tokens, call_tags, principal_kind, token_issuer)
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
           CASE WHEN business_unit IS NULL AND tier IS NULL AND tags IS NULL AND call_tags IS NULL
                     AND principal_kind IS NULL AND token_issuer IS NULL THEN NULL
                WHEN call_tags IS NULL AND principal_kind IS NULL AND token_issuer IS NULL
                     THEN md5(jsonb_build_array(business_unit, tier, tags)::text)
                ELSE md5(jsonb_build_array(business_unit, tier, tags, call_tags, principal_kind, token_issuer)::text)
           END,
           sum(cache_read_tokens), sum(cache_write_tokens), sum(cache_write_1h_tokens),
           call_tags, principal_kind, token_issuer
        FROM inserted
        GROUP BY 1, 2, 3, 4, 5, 6, 7, 8, 9, business_unit, manager_id, tier, tags, call_tags, principal_kind,
                 token_issuer
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
