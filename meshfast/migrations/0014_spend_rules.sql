-- Spend rules (issue 14, items 2-7): rules as data, the global enforcement switch, model
-- restrictions, per-calendar-day spend (the windows' source), and the outbox of rule events
-- (notifications and pauses), each deduplicated by its natural key.

-- A rule as the admin API shows it (ids of people, names of models), with a version for If-Match.
CREATE TABLE rules (
    id          text PRIMARY KEY CHECK (id ~ '^[a-z0-9-]{1,64}$'),
    body        jsonb NOT NULL,
    version     integer NOT NULL DEFAULT 1,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- The global switch: rules in mode "inherit" enforce when it is on (per-user policies always do).
ALTER TABLE gateway_state ADD COLUMN enforce_rules boolean NOT NULL DEFAULT true;

-- Per model: {leader_deny, leader_allow, exempt, business_units_closed, business_units_open}.
ALTER TABLE models ADD COLUMN restrictions jsonb;

-- Committed spend per person, model and day of the calendar (MESHFAST_CALENDAR_TZ): weekly and
-- monthly windows are sums of these days. Checkpointed from shared memory like daily_spend.
CREATE TABLE calendar_spend (
    user_id         uuid NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    model_id        uuid NOT NULL REFERENCES models (id) ON DELETE CASCADE,
    day             date NOT NULL,
    spend_nano_usd  bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (user_id, model_id, day)
);
CREATE INDEX calendar_spend_day_idx ON calendar_spend (day);

-- Backfill the current and previous month from the rows already recorded (UTC days): rules apply
-- to spend recorded before they existed.
INSERT INTO calendar_spend (user_id, model_id, day, spend_nano_usd)
SELECT l.user_id, l.model_id, (l.created_at AT TIME ZONE 'UTC')::date,
       sum(((l.input_cost + l.output_cost) * 1000000000)::bigint)
FROM request_logs l
JOIN users u ON u.id = l.user_id
JOIN models m ON m.id = l.model_id
WHERE l.created_at >= date_trunc('month', now() AT TIME ZONE 'UTC') - interval '1 month'
  AND l.outcome <> 'denied'
GROUP BY 1, 2, 3
HAVING sum(l.input_cost + l.output_cost) > 0;

-- The outbox: what a rule did to a person in a window instance. One row per rule, entry, person,
-- window instance, threshold, action and channel; a call that crosses a threshold carries the
-- event in its request row, and the row's ingest inserts it (ON CONFLICT DO NOTHING), so 200
-- concurrent crossings and a restart give one event. Notifications are delivered from here (at
-- least once, each with its delivery_id); pauses are reloaded from here on start.
CREATE TABLE rule_events (
    id               bigserial PRIMARY KEY,
    delivery_id      uuid NOT NULL DEFAULT gen_random_uuid(),
    rule_id          text NOT NULL,
    entry            integer NOT NULL,
    user_id          uuid NOT NULL,
    action           text NOT NULL CHECK (action IN ('notify', 'pause')),
    channel          text NOT NULL DEFAULT '' CHECK (channel IN ('', 'webhook', 'email')),
    "window"         text NOT NULL CHECK ("window" IN ('daily', 'weekly', 'monthly')),
    window_start     timestamptz NOT NULL,
    threshold_nano   bigint NOT NULL,
    spend_nano       bigint NOT NULL,
    detail           jsonb NOT NULL DEFAULT '{}'::jsonb,
    status           text NOT NULL DEFAULT 'pending'
                     CHECK (status IN ('pending', 'delivered', 'failed', 'skipped')),
    attempts         integer NOT NULL DEFAULT 0,
    next_attempt_at  timestamptz NOT NULL DEFAULT now(),
    last_error       text,
    delivered_at     timestamptz,
    created_at       timestamptz NOT NULL DEFAULT now(),
    UNIQUE (rule_id, entry, user_id, window_start, threshold_nano, action, channel)
);
CREATE INDEX rule_events_pending_idx ON rule_events (next_attempt_at) WHERE status = 'pending';
CREATE INDEX rule_events_window_idx ON rule_events (window_start);

DO $$
DECLARE
    t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['rules', 'calendar_spend', 'rule_events'] LOOP
        EXECUTE format('ALTER TABLE %I ENABLE ROW LEVEL SECURITY', t);
        EXECUTE format('ALTER TABLE %I FORCE ROW LEVEL SECURITY', t);
    END LOOP;

    -- Configuration: the admin writes, the gateway reads.
    CREATE POLICY admin_all ON rules FOR ALL TO meshfast_admin USING (true) WITH CHECK (true);
    CREATE POLICY gateway_read ON rules FOR SELECT TO meshfast_gateway USING (true);
    GRANT SELECT, INSERT, UPDATE, DELETE ON rules TO meshfast_admin;
    GRANT SELECT ON rules TO meshfast_gateway;

    -- Counters: the gateway writes, the admin reads (and deletes with their owners).
    CREATE POLICY admin_read ON calendar_spend FOR SELECT TO meshfast_admin USING (true);
    CREATE POLICY admin_delete ON calendar_spend FOR DELETE TO meshfast_admin USING (true);
    CREATE POLICY gateway_read ON calendar_spend FOR SELECT TO meshfast_gateway USING (true);
    CREATE POLICY gateway_insert ON calendar_spend FOR INSERT TO meshfast_gateway WITH CHECK (true);
    CREATE POLICY gateway_update ON calendar_spend FOR UPDATE TO meshfast_gateway USING (true) WITH CHECK (true);
    GRANT SELECT, DELETE ON calendar_spend TO meshfast_admin;
    GRANT SELECT, INSERT, UPDATE ON calendar_spend TO meshfast_gateway;

    -- The outbox: the gateway inserts and delivers, the admin reads (and may retry or delete).
    CREATE POLICY admin_all ON rule_events FOR ALL TO meshfast_admin USING (true) WITH CHECK (true);
    CREATE POLICY gateway_read ON rule_events FOR SELECT TO meshfast_gateway USING (true);
    CREATE POLICY gateway_insert ON rule_events FOR INSERT TO meshfast_gateway WITH CHECK (true);
    CREATE POLICY gateway_update ON rule_events FOR UPDATE TO meshfast_gateway USING (true) WITH CHECK (true);
    GRANT SELECT, INSERT, UPDATE, DELETE ON rule_events TO meshfast_admin;
    GRANT SELECT, INSERT, UPDATE ON rule_events TO meshfast_gateway;
    GRANT USAGE ON SEQUENCE rule_events_id_seq TO meshfast_admin, meshfast_gateway;
END;
$$;
