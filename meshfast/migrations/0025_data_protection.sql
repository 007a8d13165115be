-- Data protection (issue "DLP"): named policies (detector actions, custom patterns, whom they
-- apply to) as the admin API takes them, and what each call's protection found and did.
CREATE TABLE dlp_policies (
    name        text PRIMARY KEY CHECK (name ~ '^[A-Za-z0-9._-]{1,64}$'),
    -- The policy as authored (validated by the admin service before it is written).
    body        jsonb NOT NULL,
    version     integer NOT NULL DEFAULT 1,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);

DO $$
BEGIN
    ALTER TABLE dlp_policies ENABLE ROW LEVEL SECURITY;
    ALTER TABLE dlp_policies FORCE ROW LEVEL SECURITY;
    CREATE POLICY admin_all ON dlp_policies FOR ALL TO meshfast_admin USING (true) WITH CHECK (true);
    CREATE POLICY gateway_read ON dlp_policies FOR SELECT TO meshfast_gateway USING (true);
    GRANT SELECT, INSERT, UPDATE, DELETE ON dlp_policies TO meshfast_admin;
    GRANT SELECT ON dlp_policies TO meshfast_gateway;
END;
$$;

-- Per row: matches by detector ({"card": 2}) and the strongest action taken; never the values.
-- ALTER ... ADD COLUMN appends, in the same order on both tables (the ingest's SELECT * lines up).
ALTER TABLE request_logs ADD COLUMN dlp jsonb, ADD COLUMN dlp_action text;
ALTER TABLE request_logs_ingest ADD COLUMN dlp jsonb, ADD COLUMN dlp_action text;
