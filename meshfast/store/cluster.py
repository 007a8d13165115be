"""The cluster's SQL (instances, heartbeats, leases, allowances, provider shares), as named
constants with ``$n`` parameters. See meshfast/cluster.py for how they are used."""

# The cluster's exclusive advisory lock, taken with meshfast.cluster.CLUSTER_LOCK as $1
# (meshfast_lease_grant takes it shared).
LOCK_CLUSTER = "SELECT pg_advisory_xact_lock($1)"
MIGRATIONS_TABLE_EXISTS = "SELECT to_regclass('meshfast_migrations') IS NOT NULL"
APPLIED_MIGRATIONS = "SELECT coalesce(array_agg(version), '{}') FROM meshfast_migrations"
INSERT_FINGERPRINT = "INSERT INTO cluster_secrets (fingerprint) VALUES ($1) ON CONFLICT (id) DO NOTHING"
SELECT_FINGERPRINT = "SELECT fingerprint FROM cluster_secrets"
# A member is reclaimed 20 s after its last beat; an instance holding the caps whole only after
# LONE_REAP_S (it keeps serving through a database outage, so a newcomer waits that long).
REAP_DEAD = """
DELETE FROM instances
WHERE last_seen < now() - make_interval(secs => CASE WHEN mode = 'lone' THEN $2::float8 ELSE $1::float8 END)
"""
# NOTE: the allowance rows first (in one order), then the lease rows, as every other writer.
LOCK_ORPHANED = """
SELECT 1 FROM allowances WHERE resource IN (
    SELECT resource FROM leases l WHERE NOT EXISTS (SELECT 1 FROM instances i WHERE i.id = l.instance_id))
ORDER BY resource FOR UPDATE
"""
# What an instance that is gone declared stays counted; the rest of its slices returns.
REAP_ORPHANED = """
WITH gone AS (
    DELETE FROM leases l WHERE NOT EXISTS (SELECT 1 FROM instances i WHERE i.id = l.instance_id)
    RETURNING resource, amount - declared AS back
)
UPDATE allowances a SET used = a.used - g.back
FROM (SELECT resource, sum(back)::bigint AS back FROM gone GROUP BY resource) g
WHERE a.resource = g.resource
"""
REAP_SHARES = "DELETE FROM provider_shares WHERE instance_id NOT IN (SELECT id FROM instances)"
REAP_EXPIRED = "DELETE FROM allowances WHERE expires_at < now()"
OTHERS = "SELECT count(*) FROM instances WHERE id <> $1"
FOREIGN_HOLDINGS = """
SELECT (SELECT count(*) FROM leases WHERE instance_id <> $1)
     + (SELECT count(*) FROM provider_shares WHERE instance_id <> $1)
     + (SELECT count(*) FROM allowances)
"""
INSERT_INSTANCE = """
INSERT INTO instances (id, host, port, pid, workers, mode) VALUES ($1, $2, $3, $4, $5, $6)
"""
BEAT = "UPDATE instances SET last_seen = now() WHERE id = $1 RETURNING mode"
SET_MODE = "UPDATE instances SET mode = $2 WHERE id = $1"
LIST_INSTANCES = """
SELECT id::text, host, port, workers, started_at, last_seen, mode,
       last_seen > now() - make_interval(secs => $1) AS alive
FROM instances ORDER BY started_at, id
"""
OWN_LEASES = "SELECT resource, amount, declared, need, kind FROM leases WHERE instance_id = $1"
# Raises what the instance declared (before its calls may use it), within its slice.
DECLARE = """
UPDATE leases l SET declared = l.declared + r.more FROM unnest($2::bytea[], $3::bigint[]) AS r(resource, more)
WHERE l.instance_id = $1 AND l.resource = r.resource AND l.declared + r.more <= l.amount
RETURNING l.resource
"""
# Gives back a slice's room (already taken out of shared memory) and its undeclared part: what
# stays is what the instance used.
LOCK_ALLOWANCE = "SELECT 1 FROM allowances WHERE resource = $1 FOR UPDATE"
RETURN_LEASE = """
WITH old AS (
    SELECT amount, declared FROM leases WHERE resource = $1 AND instance_id = $2 AND declared >= $3 FOR UPDATE
), upd AS (
    UPDATE leases l SET amount = old.declared - $3, declared = old.declared - $3 FROM old
    WHERE l.resource = $1 AND l.instance_id = $2 RETURNING old.amount - (old.declared - $3) AS back
)
UPDATE allowances SET used = used - (SELECT back FROM upd) WHERE resource = $1 AND EXISTS (SELECT 1 FROM upd)
"""
GRANT = "SELECT meshfast_lease_grant($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)"
SHARE_LOCK = "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))"
OTHER_SHARES = """
SELECT coalesce(sum(held), 0)::bigint AS held, count(*) FILTER (WHERE wanting) AS wanting
FROM provider_shares WHERE provider_id = $1 AND kind = $2 AND instance_id <> $3
"""
UPSERT_SHARE = """
INSERT INTO provider_shares (provider_id, kind, instance_id, held, wanting) VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (provider_id, kind, instance_id) DO UPDATE SET held = EXCLUDED.held, wanting = EXCLUDED.wanting,
    updated_at = now()
"""
DELETE_OWN_LEASES = "DELETE FROM leases WHERE instance_id = $1"
DELETE_OWN_SHARES = "DELETE FROM provider_shares WHERE instance_id = $1"
DELETE_INSTANCE = "DELETE FROM instances WHERE id = $1"
