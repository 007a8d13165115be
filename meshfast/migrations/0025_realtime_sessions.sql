-- Realtime sessions (issue "ecosystem", item 2): each response of a session is a row of its own
-- (a call, count 1); the session itself leaves one more row, with its duration in latency_ms and
-- count 0, because it is not a call (summaries add up count as calls).
ALTER TABLE request_logs DROP CONSTRAINT IF EXISTS request_logs_count_check;
ALTER TABLE request_logs ADD CONSTRAINT request_logs_count_check CHECK (count >= 0);
