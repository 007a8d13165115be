-- Notification delivery (issue 14, item 5): the channels (one webhook, one SMTP relay) and the
-- leadership digest in the rule_events outbox.
--
-- The webhook secret and the SMTP password are sealed under the master key (AES-256-GCM, as
-- provider keys; meshfast.sealing), never stored or shown in the clear.
CREATE TABLE notification_settings (
    -- One row: the instance's channels.
    id                     boolean PRIMARY KEY DEFAULT true CHECK (id),
    webhook_url            text,
    -- As a provider's "local": the URL may name a loopback or private address.
    webhook_local          boolean NOT NULL DEFAULT false,
    webhook_secret_sealed  bytea,
    webhook_secret_nonce   bytea,
    smtp_host              text,
    smtp_port              integer CHECK (smtp_port BETWEEN 1 AND 65535),
    smtp_from              text,
    smtp_username          text,
    smtp_password_sealed   bytea,
    smtp_password_nonce    bytea,
    smtp_starttls          boolean NOT NULL DEFAULT false,
    version                integer NOT NULL DEFAULT 1,
    updated_at             timestamptz NOT NULL DEFAULT now()
);

-- The leadership digest goes through the same outbox: one row per leader (user_id), ended window
-- instance and channel, with rule_id '*', entry -1 and threshold 0, so the natural key
-- deduplicates it across leaders' terms and restarts. Its detail lists the people.
ALTER TABLE rule_events DROP CONSTRAINT rule_events_action_check;
ALTER TABLE rule_events ADD CONSTRAINT rule_events_action_check CHECK (action IN ('notify', 'pause', 'digest'));
-- What the delivery loop claims (pauses stay pending in the outbox and are never delivered).
CREATE INDEX rule_events_deliverable_idx ON rule_events (next_attempt_at)
    WHERE status = 'pending' AND action IN ('notify', 'digest');

DO $$
BEGIN
    ALTER TABLE notification_settings ENABLE ROW LEVEL SECURITY;
    ALTER TABLE notification_settings FORCE ROW LEVEL SECURITY;

    -- Configuration: the admin writes, the gateway (the leader's delivery loop) reads.
    CREATE POLICY admin_all ON notification_settings FOR ALL TO meshfast_admin USING (true) WITH CHECK (true);
    CREATE POLICY gateway_read ON notification_settings FOR SELECT TO meshfast_gateway USING (true);
    GRANT SELECT, INSERT, UPDATE, DELETE ON notification_settings TO meshfast_admin;
    GRANT SELECT ON notification_settings TO meshfast_gateway;
END;
$$;
