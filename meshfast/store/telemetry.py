"""The request rows' SQL: the COPY target and the rule events' outbox insert."""

# The COPY of request rows goes to this table (asyncpg's copy_records_to_table builds the
# statement from the table and INGEST_COLUMNS). COPY refuses tables under row-level security, so
# this table stores nothing: its trigger moves each row into request_logs (migration 0002).
INGEST_TABLE = "request_logs_ingest"
INGEST_COLUMNS = (
    "id", "request_id", "created_at", "mesh_key_id", "user_id", "provider_id", "model_id", "model_name",
    "requested_model", "route", "outcome", "deny_reason", "status_code", "latency_ms", "ttfb_ms",
    "tokens_in", "tokens_out", "cache_read_tokens", "cache_write_tokens", "usage_estimated",
    "input_cost", "output_cost", "web_searches", "generated_seconds", "source_ip", "user_agent",
    "browser", "browser_version", "os", "os_version", "device_type", "count",
    "business_unit", "manager_id", "tier", "would_deny", "tags", "trace_id",
    "tools_declared", "tools_declared_bytes", "tools_invoked", "cache_write_1h_tokens",
    "principal_kind", "token_issuer", "token_subject", "call_tags", "dlp", "dlp_action",
)
# What the outbox takes from a row's events (migration 0014), one array per column.
INSERT_RULE_EVENTS = """
INSERT INTO rule_events (rule_id, entry, user_id, action, channel, "window", window_start, threshold_nano,
                         spend_nano, detail)
SELECT rule_id, entry, user_id, action, channel, "window", window_start, threshold_nano, spend_nano, detail::jsonb
FROM unnest($1::text[], $2::int4[], $3::uuid[], $4::text[], $5::text[], $6::text[], $7::timestamptz[],
            $8::int8[], $9::int8[], $10::text[])
     AS e (rule_id, entry, user_id, action, channel, "window", window_start, threshold_nano, spend_nano, detail)
ON CONFLICT DO NOTHING
"""
