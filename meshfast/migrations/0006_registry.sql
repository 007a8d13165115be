-- The registry as validated data (Cosmos §6): the price classes, the long-context tier and the
-- extra deployments existed as columns and a table; now the database refuses what the admin
-- service refuses, and a deployment is identified by what it points at, so a registry file
-- applied twice updates it instead of adding a copy.
ALTER TABLE models
    ADD CONSTRAINT models_cache_prices_nonnegative CHECK (
        COALESCE(cache_read_price_per_1k_tokens, 0) >= 0
        AND COALESCE(cache_write_price_per_1k_tokens, 0) >= 0
        AND COALESCE(cache_write_1h_price_per_1k_tokens, 0) >= 0),
    ADD CONSTRAINT models_long_context_together CHECK (
        (long_context_threshold_tokens IS NULL) = (long_context_prices IS NULL)),
    ADD CONSTRAINT models_long_context_threshold_positive CHECK (
        long_context_threshold_tokens IS NULL OR long_context_threshold_tokens > 0);

ALTER TABLE model_deployments
    ADD CONSTRAINT model_deployments_target_key UNIQUE (model_id, provider_id, resolved_model);
-- The unique index covers lookups by model; the old one is redundant.
DROP INDEX model_deployments_model_idx;
