"""The counters' checkpoints and seeds, as named constants with ``$n`` parameters.

A checkpoint adds a counter's delta and returns the database total. The seeds come packed, one
bytea per query of `a ‖ b ‖ period (int4) ‖ value (int8)` records (Segment.seed_packed): a million
counters cost PostgreSQL one aggregate and the core one pass, with no row objects in Python. `a`
and `b` are 16 bytes each (a uuid, or sixteen zero bytes for none); each seed spells the same
aggregate out, `coalesce(string_agg(a || b || int4send(period) || int8send(value)), '')`.
"""

UPSERT_DAILY_SPEND = """
INSERT INTO daily_spend (user_id, model_id, day, spend_nano_usd) VALUES ($1, $2, $3, $4)
ON CONFLICT (user_id, model_id, day)
DO UPDATE SET spend_nano_usd = daily_spend.spend_nano_usd + EXCLUDED.spend_nano_usd
RETURNING spend_nano_usd
"""
UPSERT_USER_HOURLY = """
INSERT INTO user_model_hourly_usage (user_id, model_id, hour_start, call_count) VALUES ($1, $2, $3, $4)
ON CONFLICT (user_id, model_id, hour_start)
DO UPDATE SET call_count = user_model_hourly_usage.call_count + EXCLUDED.call_count
RETURNING call_count
"""
UPSERT_PROVIDER_HOURLY = """
INSERT INTO provider_hourly_usage (provider_id, hour_start, call_count) VALUES ($1, $2, $3)
ON CONFLICT (provider_id, hour_start) DO UPDATE SET call_count = provider_hourly_usage.call_count + EXCLUDED.call_count
RETURNING call_count
"""
SEED_DAILY_SPEND = """
SELECT coalesce(string_agg(uuid_send(user_id) || uuid_send(model_id) || int4send((day - DATE '1970-01-01')::int)
                           || int8send((spend_nano_usd)::bigint), ''::bytea), ''::bytea)
FROM daily_spend WHERE day >= $1
"""
SEED_USER_HOURLY = """
SELECT coalesce(string_agg(uuid_send(user_id) || uuid_send(model_id)
                           || int4send((extract(epoch FROM hour_start)::bigint / 3600)::int)
                           || int8send((call_count)::bigint), ''::bytea), ''::bytea)
FROM user_model_hourly_usage WHERE hour_start >= $1
"""
SEED_PROVIDER_HOURLY = """
SELECT coalesce(string_agg(decode('00000000000000000000000000000000', 'hex') || uuid_send(provider_id)
                           || int4send((extract(epoch FROM hour_start)::bigint / 3600)::int)
                           || int8send((call_count)::bigint), ''::bytea), ''::bytea)
FROM provider_hourly_usage WHERE hour_start >= $1
"""
UPSERT_CALENDAR_SPEND = """
INSERT INTO calendar_spend (user_id, model_id, day, spend_nano_usd) VALUES ($1, $2, $3, $4)
ON CONFLICT (user_id, model_id, day)
DO UPDATE SET spend_nano_usd = calendar_spend.spend_nano_usd + EXCLUDED.spend_nano_usd
RETURNING spend_nano_usd
"""
SEED_CALENDAR_DAYS = """
SELECT coalesce(string_agg(uuid_send(user_id) || uuid_send(model_id) || int4send((day - DATE '1970-01-01')::int)
                           || int8send((spend_nano_usd)::bigint), ''::bytea), ''::bytea)
FROM calendar_spend WHERE day >= $1
"""
# The week's or month's sum per pair, under the window's period ($3).
SEED_CALENDAR_SUM = """
SELECT coalesce(string_agg(uuid_send(user_id) || uuid_send(model_id) || int4send(($3)::int)
                           || int8send((spend)::bigint), ''::bytea), ''::bytea) FROM (
    SELECT user_id, model_id, sum(spend_nano_usd) AS spend FROM calendar_spend
    WHERE day >= $1 AND day <= $2 GROUP BY user_id, model_id) sums
"""
UPSERT_WORKFLOW_SPEND = """
INSERT INTO workflow_spend (workflow_uid, "window", period, spend_nano_usd)
SELECT $1, w."window", $2, $3 FROM workflows w WHERE w.uid = $1
ON CONFLICT (workflow_uid, period)
DO UPDATE SET spend_nano_usd = workflow_spend.spend_nano_usd + EXCLUDED.spend_nano_usd
RETURNING spend_nano_usd
"""
# Each workflow's spend in its window's current instance ($1 day, $2 week, $3 month periods).
SEED_WORKFLOW_SPEND = """
SELECT coalesce(string_agg(decode('00000000000000000000000000000000', 'hex') || uuid_send(workflow_uid)
                           || int4send((period)::int) || int8send((spend_nano_usd)::bigint), ''::bytea), ''::bytea)
FROM workflow_spend
WHERE ("window" = 'daily' AND period >= $1) OR ("window" = 'weekly' AND period >= $2)
   OR ("window" = 'monthly' AND period >= $3)
"""
SEED_PAUSES = """
SELECT rule_id, entry, user_id, "window", window_start, (detail->>'started_at_ms')::bigint AS started_at_ms
FROM rule_events WHERE action = 'pause' AND window_start >= $1
"""
