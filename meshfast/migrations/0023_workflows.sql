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

-- The cluster's slices of a workflow's budget (migration 0017's grant, one branch more): the
-- first slice of a window starts from the spend the database holds for it.
CREATE OR REPLACE FUNCTION meshfast_lease_grant(
    p_resource bytea, p_instance uuid, p_kind smallint, p_a uuid, p_b uuid, p_period integer,
    p_cap bigint, p_need bigint, p_base bigint, p_expires timestamptz,
    p_models uuid[], p_from date, p_to date
) RETURNS bigint
LANGUAGE plpgsql SET search_path = public AS $$
DECLARE
    v_amount bigint;
    v_declared bigint;
    v_used bigint;
    v_base bigint;
    v_grant bigint;
    v_decl bigint;
    v_live bigint;
BEGIN
    PERFORM pg_advisory_xact_lock_shared(7164774026633454957);
    -- Nothing is leased while an instance holds the caps whole (it is switching within seconds),
    -- nor to an instance that is not a registered member (reclaimed: it registers again).
    IF EXISTS (SELECT 1 FROM instances WHERE mode = 'lone')
       OR NOT EXISTS (SELECT 1 FROM instances WHERE id = p_instance AND mode = 'cluster') THEN
        RETURN -1;
    END IF;
    -- NOTE: the allowance row is always locked before a lease row (here and in every writer).
    SELECT used INTO v_used FROM allowances WHERE resource = p_resource FOR UPDATE;
    IF NOT FOUND THEN
        IF p_kind = 1 THEN
            SELECT spend_nano_usd INTO v_base FROM daily_spend
            WHERE user_id = p_a AND model_id = p_b AND day = date '1970-01-01' + p_period;
        ELSIF p_kind = 2 THEN
            SELECT call_count INTO v_base FROM user_model_hourly_usage
            WHERE user_id = p_a AND model_id = p_b AND hour_start = to_timestamp(p_period::bigint * 3600);
        ELSIF p_kind = 3 THEN
            SELECT call_count INTO v_base FROM provider_hourly_usage
            WHERE provider_id = p_b AND hour_start = to_timestamp(p_period::bigint * 3600);
        ELSIF p_kind = 16 THEN
            -- A rule entry's threshold: the spend in scope and window the database holds, or
            -- what the asking instance counted if that is more.
            SELECT greatest(p_base, coalesce(sum(spend_nano_usd), 0))::bigint INTO v_base FROM calendar_spend
            WHERE user_id = p_a AND model_id = ANY(p_models) AND day BETWEEN p_from AND p_to;
        ELSIF p_kind = 19 THEN
            -- A workflow's budget: its checkpointed spend in the window instance, or what the
            -- asking instance counted if that is more (p_b is the workflow's uid).
            SELECT greatest(p_base, coalesce(sum(spend_nano_usd), 0))::bigint INTO v_base FROM workflow_spend
            WHERE workflow_uid = p_b AND period = p_period;
        ELSE
            v_base := p_base;
        END IF;
        INSERT INTO allowances (resource, used, expires_at) VALUES (p_resource, coalesce(v_base, 0), p_expires)
        ON CONFLICT (resource) DO NOTHING;
        SELECT used INTO v_used FROM allowances WHERE resource = p_resource FOR UPDATE;
    END IF;
    SELECT amount, declared INTO v_amount, v_declared FROM leases
    WHERE resource = p_resource AND instance_id = p_instance FOR UPDATE;
    IF FOUND AND v_amount - v_declared >= p_need THEN
        v_decl := least(v_amount - v_declared, 2 * p_need);
        UPDATE leases SET declared = declared + v_decl, need = p_need
        WHERE resource = p_resource AND instance_id = p_instance;
        RETURN v_decl;
    END IF;
    SELECT count(*) INTO v_live FROM instances WHERE last_seen > now() - interval '10 s';
    v_grant := least(greatest(p_need, (p_cap - v_used) / (2 * greatest(v_live, 1))), p_cap - v_used);
    IF v_grant < p_need OR v_grant <= 0 THEN
        RETURN 0;
    END IF;
    v_decl := least(v_grant, 2 * p_need);
    UPDATE allowances SET used = used + v_grant WHERE resource = p_resource;
    INSERT INTO leases (resource, instance_id, amount, declared, need, kind)
    VALUES (p_resource, p_instance, v_grant, v_decl, p_need, p_kind)
    ON CONFLICT (resource, instance_id) DO UPDATE
    SET amount = leases.amount + EXCLUDED.amount, declared = leases.declared + EXCLUDED.declared, need = EXCLUDED.need;
    RETURN v_decl;
END;
$$;
