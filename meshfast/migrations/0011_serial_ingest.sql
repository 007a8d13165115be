-- Concurrent ingest batches (one COPY per worker) could deadlock on the rollup upserts of the
-- statement-level ingest trigger: each batch upserts many rollup rows, in an order no two batches
-- share. A statement-level BEFORE trigger now takes a transaction-scoped advisory lock, so the
-- batches take turns; the lock is held until the COPY's transaction ends, past the AFTER trigger.
CREATE FUNCTION meshfast_ingest_request_logs_lock() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('meshfast_ingest_request_logs'));
    RETURN NULL;
END;
$$;

CREATE TRIGGER request_logs_ingest_lock BEFORE INSERT ON request_logs_ingest
    FOR EACH STATEMENT EXECUTE FUNCTION meshfast_ingest_request_logs_lock();
REVOKE ALL ON FUNCTION meshfast_ingest_request_logs_lock() FROM PUBLIC;
