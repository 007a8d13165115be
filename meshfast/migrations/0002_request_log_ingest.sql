-- COPY refuses tables under row-level security, so request rows are COPYed into an ingest
-- table that stores nothing: a BEFORE INSERT trigger running with the definer's rights moves
-- each row into request_logs, where RLS applies. The gateway may only INSERT here; the table
-- has no RLS because it never holds a row.

CREATE TABLE request_logs_ingest (LIKE request_logs INCLUDING DEFAULTS);

CREATE FUNCTION meshfast_route_request_log() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public AS $$
BEGIN
    INSERT INTO request_logs VALUES (NEW.*);
    RETURN NULL;
END;
$$;

CREATE TRIGGER request_logs_ingest_route BEFORE INSERT ON request_logs_ingest
    FOR EACH ROW EXECUTE FUNCTION meshfast_route_request_log();

REVOKE ALL ON request_logs_ingest FROM PUBLIC;
GRANT INSERT ON request_logs_ingest TO meshfast_gateway;
REVOKE ALL ON FUNCTION meshfast_route_request_log() FROM PUBLIC;
