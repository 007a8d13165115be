-- Workflow budgets (issue "identity", item 4): calls tagged `workflow=<id>` (X-Meshfast-Tags)
-- reserve their worst case against a registered workflow's budget in its calendar window
-- (MESHFAST_CALENDAR_TZ, as the spend rules'), and only the principals it lists may charge it.
-- The request path keeps the spend in shared memory (counter kind WORKFLOW_SPEND); the leader
-- checkpoints it here, and a start seeds it back.
CREATE TABLE workflows (
    uid             uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    id              text NOT NULL UNIQUE CHECK (id ~ '^[A-Za-z0-9._-]{1,64}$'),
    limit_nano_usd  bigint NOT NULL CHECK (limit_nano_usd > 0),
    "window"        text NOT NULL CHECK ("window" IN ('daily', 'weekly', 'monthly')),
    -- NULL: anyone may charge it; else [{"user_id": ..} | {"business_unit": ..}, ...].
    principals      jsonb,
    created_at      timestamptz NOT NULL DEFAULT now()
);

-- A workflow's settled spend per window instance (period as the core counts it: days, weeks from
-- Monday 1969-12-29, or months since January 1970, in the calendar's zone).
CREATE TABLE workflow_spend (
    workflow_uid    uuid NOT NULL REFERENCES workflows (uid) ON DELETE CASCADE,
    "window"        text NOT NULL,
    period          integer NOT NULL,
    spend_nano_usd  bigint NOT NULL,
    PRIMARY KEY (workflow_uid, period)
);

DO $$
BEGIN
    ALTER TABLE workflows ENABLE ROW LEVEL SECURITY;
    ALTER TABLE workflows FORCE ROW LEVEL SECURITY;
    CREATE POLICY admin_all ON workflows FOR ALL TO meshfast_admin USING (true) WITH CHECK (true);
    CREATE POLICY gateway_read ON workflows FOR SELECT TO meshfast_gateway USING (true);
    GRANT SELECT, INSERT, UPDATE, DELETE ON workflows TO meshfast_admin;
    GRANT SELECT ON workflows TO meshfast_gateway;

    ALTER TABLE workflow_spend ENABLE ROW LEVEL SECURITY;
    ALTER TABLE workflow_spend FORCE ROW LEVEL SECURITY;
    CREATE POLICY admin_read ON workflow_spend FOR SELECT TO meshfast_admin USING (true);
    CREATE POLICY admin_delete ON workflow_spend FOR DELETE TO meshfast_admin USING (true);
    CREATE POLICY gateway_read ON workflow_spend FOR SELECT TO meshfast_gateway USING (true);
    CREATE POLICY gateway_insert ON workflow_spend FOR INSERT TO meshfast_gateway WITH CHECK (true);
    CREATE POLICY gateway_update ON workflow_spend FOR UPDATE TO meshfast_gateway USING (true) WITH CHECK (true);
    GRANT SELECT, DELETE ON workflow_spend TO meshfast_admin;
    GRANT SELECT, INSERT, UPDATE ON workflow_spend TO meshfast_gateway;
END;
$$;
