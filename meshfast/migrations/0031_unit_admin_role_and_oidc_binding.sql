-- A business-unit administrator is one explicitly (admins.unit_admin), not only while it is listed
-- for a unit: set the first time it is listed (by a platform administrator, a registry file or an
-- OIDC login with a unit role) and never cleared by losing its units, so an administrator left
-- with no unit is scoped to nothing rather than unscoped.
ALTER TABLE admins ADD COLUMN unit_admin boolean NOT NULL DEFAULT false;
UPDATE admins SET unit_admin = true WHERE id IN (SELECT admin_id FROM business_unit_admins);

-- The OIDC identity an admin was first logged in as (the issuer and its subject): a later login
-- for the same email with another subject is refused.
ALTER TABLE admins ADD COLUMN oidc_issuer text, ADD COLUMN oidc_subject text;

-- The throttle bucket (the source address) a pending OIDC login was begun from: pending logins
-- are capped per source, so one source cannot fill the table for everybody.
ALTER TABLE admin_oidc_attempts ADD COLUMN source text NOT NULL DEFAULT '';
CREATE INDEX admin_oidc_attempts_source_idx ON admin_oidc_attempts (source, created_at);
