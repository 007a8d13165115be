-- Admin login through an OIDC issuer (API.md "Governed lifecycle"): one row per login begun at
-- GET /admin/oidc/login and not yet finished, so any worker of any instance can finish it. The
-- row is keyed by the SHA-256 of its state (the browser holds the state itself, in a short-lived
-- cookie) and is deleted when the callback consumes it; the PKCE verifier is not stored (it is
-- derived from the state with the instance's pepper), so nothing here completes a login.
CREATE TABLE admin_oidc_attempts (
    state_hash    text PRIMARY KEY,
    nonce         text NOT NULL,
    redirect_uri  text NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    expires_at    timestamptz NOT NULL
);
CREATE INDEX admin_oidc_attempts_expires_idx ON admin_oidc_attempts (expires_at);

DO $$
BEGIN
    ALTER TABLE admin_oidc_attempts ENABLE ROW LEVEL SECURITY;
    ALTER TABLE admin_oidc_attempts FORCE ROW LEVEL SECURITY;
    -- The admin plane's own: the gateway role never reads it.
    CREATE POLICY admin_all ON admin_oidc_attempts FOR ALL TO meshfast_admin USING (true) WITH CHECK (true);
    GRANT SELECT, INSERT, UPDATE, DELETE ON admin_oidc_attempts TO meshfast_admin;
END;
$$;
