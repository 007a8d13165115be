-- Governed changes to controls (API.md "Governed lifecycle"): the approval queue and every
-- accepted revision of a control (a spend rule, a model's restrictions, a per-person policy, and
-- any kind registered later, e.g. pilots), scheduled or enforced.
--
-- changes: a business-unit administrator's write that relaxes a control waits here for a
-- platform administrator. `body` is the exact proposed control as it would be stored (NULL for a
-- delete), `base_version` the fingerprint of the control it was written against, `digest` the
-- sha256 of kind, target, action, body and activate_at (what the approver reviewed: the ETag).
CREATE TABLE changes (
    id                     uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    kind                   text NOT NULL,
    target                 text NOT NULL,
    action                 text NOT NULL CHECK (action IN ('create', 'update', 'delete')),
    body                   jsonb,
    base_version           text NOT NULL,
    digest                 text NOT NULL,
    status                 text NOT NULL DEFAULT 'pending' CHECK (status IN
                               ('pending', 'approved', 'rejected', 'expired', 'applied', 'failed', 'superseded')),
    requested_by           text NOT NULL,
    requested_by_id        text NOT NULL,
    requested_by_admin_id  uuid,
    business_unit          text,
    activate_at            timestamptz,
    comment                text,
    decided_by             text,
    created_at             timestamptz NOT NULL DEFAULT now(),
    decided_at             timestamptz,
    expires_at             timestamptz NOT NULL
);
CREATE INDEX changes_status_idx ON changes (status, created_at DESC);
CREATE INDEX changes_target_idx ON changes (kind, target) WHERE status = 'pending';

-- control_revisions: every accepted write of a control. One revision per (kind, target) is
-- `enforced` (the live one); a `scheduled` one waits for activate_at (the leader applies it);
-- one that failed its re-validation at activation is `failed` with its error, and the enforced
-- one stays.
CREATE TABLE control_revisions (
    kind         text NOT NULL,
    target       text NOT NULL,
    revision     integer NOT NULL,
    action       text NOT NULL CHECK (action IN ('create', 'update', 'delete')),
    body         jsonb,
    status       text NOT NULL CHECK (status IN ('scheduled', 'enforced', 'superseded', 'failed', 'cancelled')),
    activate_at  timestamptz,
    error        text,
    change_id    uuid REFERENCES changes (id) ON DELETE SET NULL,
    created_by   text NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    enforced_at  timestamptz,
    PRIMARY KEY (kind, target, revision)
);
CREATE INDEX control_revisions_due_idx ON control_revisions (activate_at) WHERE status = 'scheduled';

DO $$
DECLARE
    t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['changes', 'control_revisions'] LOOP
        EXECUTE format('ALTER TABLE %I ENABLE ROW LEVEL SECURITY', t);
        EXECUTE format('ALTER TABLE %I FORCE ROW LEVEL SECURITY', t);
        EXECUTE format('CREATE POLICY admin_all ON %I FOR ALL TO meshfast_admin USING (true) WITH CHECK (true)', t);
        EXECUTE format('CREATE POLICY gateway_read ON %I FOR SELECT TO meshfast_gateway USING (true)', t);
        EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON %I TO meshfast_admin', t);
        EXECUTE format('GRANT SELECT ON %I TO meshfast_gateway', t);
    END LOOP;
END;
$$;
