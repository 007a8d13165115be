-- Several instances on one PostgreSQL (issue 15).
--
-- instances: every running `meshfast serve` registers itself and beats once a second. An instance
-- is "lone" while no other instance is alive or holds anything: it then holds every cap whole, as
-- a single host always did. As soon as another one registers, each caps' allowance is leased to
-- instances in slices (allowances, leases) and each provider's rate and concurrency limits are
-- split in shares (provider_shares), so the sum over instances stays within every cap.
CREATE TABLE instances (
    id          uuid PRIMARY KEY,
    host        text NOT NULL,
    port        integer NOT NULL,
    pid         integer NOT NULL,
    workers     integer NOT NULL,
    started_at  timestamptz NOT NULL DEFAULT now(),
    last_seen   timestamptz NOT NULL DEFAULT now(),
    mode        text NOT NULL DEFAULT 'cluster' CHECK (mode IN ('lone', 'cluster'))
);

-- One row: a fingerprint of the cluster's secrets (master key and key pepper), so an instance
-- started with another secrets.json refuses to start instead of answering 401s.
CREATE TABLE cluster_secrets (
    id           boolean PRIMARY KEY DEFAULT true CHECK (id),
    fingerprint  bytea NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now()
);

-- A cap's allowance in one window: `used` is what was spent before leasing began (the base)
-- plus every lease's amount; a grant never takes it past the cap. `resource` is the counter's
-- shared-memory key (the same 16 bytes on every instance).
CREATE TABLE allowances (
    resource    bytea PRIMARY KEY,
    used        bigint NOT NULL,
    expires_at  timestamptz NOT NULL
);

-- What each instance holds of an allowance: `amount` granted, of which `declared` it may have
-- used: an instance raises `declared` here before it lets its calls use the room, so what a dead
-- or cut-off instance may have spent is never more than `declared`. When it dies, `amount -
-- declared` returns at once (20 s after its last heartbeat); `need` is its last call's worst case.
CREATE TABLE leases (
    resource     bytea NOT NULL REFERENCES allowances ON DELETE CASCADE,
    instance_id  uuid NOT NULL,
    amount       bigint NOT NULL CHECK (amount >= 0),
    declared     bigint NOT NULL DEFAULT 0 CHECK (declared >= 0 AND declared <= amount),
    need         bigint NOT NULL DEFAULT 0,
    -- The counter's kind (as meshfast_lease_grant's p_kind).
    kind         smallint NOT NULL DEFAULT 1,
    PRIMARY KEY (resource, instance_id)
);
CREATE INDEX leases_instance_idx ON leases (instance_id);

-- A provider's limit split over instances: kind 0 = concurrency slots, 1 = rate in milli-requests
-- per second. `wanting` says the instance refused calls for want of share at its last beat.
CREATE TABLE provider_shares (
    provider_id  uuid NOT NULL,
    kind         smallint NOT NULL CHECK (kind IN (0, 1)),
    instance_id  uuid NOT NULL,
    held         bigint NOT NULL CHECK (held >= 0),
    wanting      boolean NOT NULL DEFAULT false,
    updated_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (provider_id, kind, instance_id)
);

-- Declares room for a call of worst case `need` (and one more like it) on one instance: from the
-- undeclared part of its slice, else from a new slice of the cap (half of what remains shared by
-- the live instances, so slices shrink near the cap), never past the cap. Returns the room
-- declared (the instance raises its ceiling by it), 0 when even `need` does not fit, -1 while
-- another instance still holds the caps whole (it is switching to leases within a beat).
-- The base of a new allowance is the committed count the database holds for the counter (kind
-- 1 = per-user daily spend, 2 = per-user calls per hour, 3 = provider calls per hour, as the
-- core's counter kinds); for a rule entry's threshold (16) the spend in scope and window the
-- asking instance counted (`p_base`).
CREATE FUNCTION meshfast_lease_grant(
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

DO $$
DECLARE
    t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['instances', 'cluster_secrets', 'allowances', 'leases', 'provider_shares'] LOOP
        EXECUTE format('ALTER TABLE %I ENABLE ROW LEVEL SECURITY', t);
        EXECUTE format('ALTER TABLE %I FORCE ROW LEVEL SECURITY', t);
        -- Cluster state: the gateway keeps it, the admin reads it.
        EXECUTE format('CREATE POLICY gateway_all ON %I FOR ALL TO meshfast_gateway USING (true) WITH CHECK (true)', t);
        EXECUTE format('CREATE POLICY admin_read ON %I FOR SELECT TO meshfast_admin USING (true)', t);
        EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON %I TO meshfast_gateway', t);
        EXECUTE format('GRANT SELECT ON %I TO meshfast_admin', t);
    END LOOP;
    GRANT EXECUTE ON FUNCTION meshfast_lease_grant(bytea, uuid, smallint, uuid, uuid, integer, bigint, bigint, bigint, timestamptz, uuid[], date, date)
        TO meshfast_gateway;
END;
$$;
