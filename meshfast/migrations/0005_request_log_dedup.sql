-- Replayed rows are deduplicated by request id: a row's key (id, created_at) is derived from its
-- request id, so a spooled row that already reached the table (a COPY that committed while its
-- client saw an error, or a replay cut short) is skipped instead of failing the whole batch.
CREATE OR REPLACE FUNCTION meshfast_route_request_log() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public AS $$
BEGIN
    INSERT INTO request_logs VALUES (NEW.*) ON CONFLICT DO NOTHING;
    RETURN NULL;
END;
$$;
