-- Idempotency-Key on admin creates: the first request with a key runs and its answer is kept
-- (secrets redacted) for 24 h; a retry with the same key and body gets that answer again, a
-- different body under the same key is refused.
CREATE TABLE admin_idempotency (
    actor        text NOT NULL,
    key          text NOT NULL,
    request_hash text NOT NULL,
    status       integer NOT NULL DEFAULT 0,  -- 0 while the first request runs
    response     jsonb,
    created_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (actor, key)
);
ALTER TABLE admin_idempotency ENABLE ROW LEVEL SECURITY;
ALTER TABLE admin_idempotency FORCE ROW LEVEL SECURITY;
CREATE POLICY admin_all ON admin_idempotency FOR ALL TO meshfast_admin USING (true) WITH CHECK (true);
GRANT SELECT, INSERT, UPDATE, DELETE ON admin_idempotency TO meshfast_admin;

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
    DELETE FROM admin_idempotency WHERE created_at < now() - interval '24 hours';
    RETURN jsonb_build_object('partitions_dropped', dropped, 'rollup_rows_deleted', rollup_rows,
                              'sessions_deleted', sessions);
END;
$$;
