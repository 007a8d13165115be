-- Model onboarding and pilots (API.md "Governed lifecycle"). A model's status gains `staged`
-- (not served) and `limited` (served to its roster only, with its own spend cap in a window and an
-- expiry, after which it answers as staged). A pilot is a cohort (members) trying models, with its
-- own enforcement mode, an optional tier ladder of spend caps over its models together, an expiry,
-- and, when authoritative, the say over its members' access to its models.
ALTER TABLE models DROP CONSTRAINT IF EXISTS models_status_check;
ALTER TABLE models ADD CONSTRAINT models_status_check
    CHECK (status IN ('active', 'retired', 'staged', 'limited'));
-- The roster: user ids (text, canonical). The limited-access cap: window, amount, expiry.
ALTER TABLE models ADD COLUMN roster jsonb NOT NULL DEFAULT '[]'::jsonb;
ALTER TABLE models ADD COLUMN limited_window text CHECK (limited_window IN ('daily', 'weekly', 'monthly'));
ALTER TABLE models ADD COLUMN limited_amount_usd numeric(20, 9) CHECK (limited_amount_usd > 0);
ALTER TABLE models ADD COLUMN limited_expires_at timestamptz;

CREATE TABLE pilots (
    id             uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    name           text NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    -- User ids (canonical text) and model names.
    members        jsonb NOT NULL DEFAULT '[]'::jsonb,
    models         jsonb NOT NULL DEFAULT '[]'::jsonb,
    authoritative  boolean NOT NULL DEFAULT false,
    mode           text NOT NULL DEFAULT 'inherit' CHECK (mode IN ('enforce', 'shadow', 'inherit')),
    expires_at     timestamptz,
    -- The tier ladder: [{name, amount_usd (decimal text), window, exceptions: [user ids]}].
    tiers          jsonb NOT NULL DEFAULT '[]'::jsonb,
    version        integer NOT NULL DEFAULT 1,
    created_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX pilots_expires_idx ON pilots (expires_at);

DO $$
DECLARE
    t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['pilots'] LOOP
        EXECUTE format('ALTER TABLE %I ENABLE ROW LEVEL SECURITY', t);
        EXECUTE format('ALTER TABLE %I FORCE ROW LEVEL SECURITY', t);
        EXECUTE format('CREATE POLICY admin_all ON %I FOR ALL TO meshfast_admin USING (true) WITH CHECK (true)', t);
        EXECUTE format('CREATE POLICY gateway_read ON %I FOR SELECT TO meshfast_gateway USING (true)', t);
        EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON %I TO meshfast_admin', t);
        EXECUTE format('GRANT SELECT ON %I TO meshfast_gateway', t);
    END LOOP;
END;
$$;
