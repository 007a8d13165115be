-- Retention (run by the leader, with the definer's rights since the gateway role owns nothing):
-- whole daily partitions of request_logs older than `days` are dropped (no row-by-row delete),
-- rollup rows of those days go too, and expired admin sessions are swept.
CREATE FUNCTION meshfast_retention(days integer) RETURNS jsonb
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
