-- Platform tokens (issue "identity", item 3): the issuers whose JWTs the data plane verifies
-- offline. An issuer's keys are an inline JWK Set (`jwks`) or fetched from `jwks_url` in the
-- background: `fetched_jwks` is the last good set. Workers trust a fetched set until
-- `published_at` + MESHFAST_JWKS_MAX_AGE_S (the snapshot carries it); a set whose fetches keep
-- failing past that fails closed.
CREATE TABLE issuers (
    id                   uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    issuer               text NOT NULL UNIQUE CHECK (length(issuer) BETWEEN 1 AND 512),
    audiences            text[] NOT NULL CHECK (cardinality(audiences) >= 1),
    jwks_url             text,
    jwks                 jsonb,
    algorithms           text[] NOT NULL,
    clock_skew_s         integer NOT NULL DEFAULT 60 CHECK (clock_skew_s BETWEEN 0 AND 3600),
    claims               jsonb NOT NULL,
    jit_provisioning     boolean NOT NULL DEFAULT false,
    local                boolean NOT NULL DEFAULT false,
    fetched_jwks         jsonb,
    fetched_at           timestamptz,
    published_at         timestamptz,
    fetch_attempted_at   timestamptz,
    fetch_requested_at   timestamptz,
    fetch_error          text,
    created_at           timestamptz NOT NULL DEFAULT now(),
    CHECK ((jwks_url IS NULL) <> (jwks IS NULL))
);

-- Who a row's caller was: a person or (later) an application, and the platform token's issuer and
-- subject when a JWT authenticated the call. ALTER ... ADD COLUMN appends, in the same order on
-- both tables, so the ingest's `INSERT INTO request_logs SELECT * FROM batch` still lines up.
ALTER TABLE request_logs
    ADD COLUMN principal_kind text,
    ADD COLUMN token_issuer text,
    ADD COLUMN token_subject text;
ALTER TABLE request_logs_ingest
    ADD COLUMN principal_kind text,
    ADD COLUMN token_issuer text,
    ADD COLUMN token_subject text;

DO $$
BEGIN
    ALTER TABLE issuers ENABLE ROW LEVEL SECURITY;
    ALTER TABLE issuers FORCE ROW LEVEL SECURITY;
    -- Configuration: the admin writes (the key fetch and just-in-time provisioning run as the
    -- admin role too), the gateway reads.
    CREATE POLICY admin_all ON issuers FOR ALL TO meshfast_admin USING (true) WITH CHECK (true);
    CREATE POLICY gateway_read ON issuers FOR SELECT TO meshfast_gateway USING (true);
    GRANT SELECT, INSERT, UPDATE, DELETE ON issuers TO meshfast_admin;
    GRANT SELECT ON issuers TO meshfast_gateway;
END;
$$;
