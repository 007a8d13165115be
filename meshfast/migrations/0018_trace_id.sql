-- OpenTelemetry (issue "ecosystem", item 3): a traced request's row keeps its trace id (32 hex
-- digits), so a trace leads to the row and the row to the trace. NULL when tracing is off.
-- ALTER ... ADD COLUMN appends, in the same order on both tables, so the ingest's
-- `INSERT INTO request_logs SELECT * FROM batch` still lines the columns up.
ALTER TABLE request_logs ADD COLUMN trace_id text;
ALTER TABLE request_logs_ingest ADD COLUMN trace_id text;
