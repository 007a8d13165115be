-- Idempotency-Key on admin creates: the first request with a key runs and its answer is kept
-- (secrets redacted) for 24 h; a retry with the same key and body gets that answer again, a
-- different body under the same key is refused. Retention (0008) deletes keys after a day.
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
