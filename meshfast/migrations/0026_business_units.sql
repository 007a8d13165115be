-- Business units as entities (API.md "Governed lifecycle"): a unit is named as users'
-- business_unit already is, has a timezone (for "local-midnight" activation) and administrators.
-- An admin listed for one or more units is a business-unit administrator scoped to them; an admin
-- listed for none keeps the rights its is_super flag gives. Admin tokens carry a scope the same
-- way: NULL is unscoped, an array of unit names scopes the token to them.
CREATE TABLE business_units (
    id          uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    name        text NOT NULL UNIQUE CHECK (length(name) BETWEEN 1 AND 128),
    timezone    text NOT NULL DEFAULT 'UTC',
    version     integer NOT NULL DEFAULT 1,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE business_unit_admins (
    business_unit_id  uuid NOT NULL REFERENCES business_units (id) ON DELETE CASCADE,
    admin_id          uuid NOT NULL REFERENCES admins (id) ON DELETE CASCADE,
    PRIMARY KEY (business_unit_id, admin_id)
);
CREATE INDEX business_unit_admins_admin_idx ON business_unit_admins (admin_id);

ALTER TABLE admin_tokens ADD COLUMN business_units text[];

-- The unit an audited change concerns (NULL: platform-wide), so a unit's administrators read
-- their own units' records.
ALTER TABLE admin_audit_log ADD COLUMN business_unit text;
CREATE INDEX admin_audit_log_unit_idx ON admin_audit_log (business_unit, created_at DESC)
    WHERE business_unit IS NOT NULL;

DO $$
DECLARE
    t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['business_units', 'business_unit_admins'] LOOP
        EXECUTE format('ALTER TABLE %I ENABLE ROW LEVEL SECURITY', t);
        EXECUTE format('ALTER TABLE %I FORCE ROW LEVEL SECURITY', t);
        EXECUTE format('CREATE POLICY admin_all ON %I FOR ALL TO meshfast_admin USING (true) WITH CHECK (true)', t);
        EXECUTE format('CREATE POLICY gateway_read ON %I FOR SELECT TO meshfast_gateway USING (true)', t);
        EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON %I TO meshfast_admin', t);
        EXECUTE format('GRANT SELECT ON %I TO meshfast_gateway', t);
    END LOOP;
END;
$$;
