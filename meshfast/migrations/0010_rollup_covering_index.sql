-- Spend by person over partial days at a window's edges reads the hourly rollup by hour alone:
-- a covering index makes that an index-only range scan.
CREATE INDEX request_rollup_hourly_hour_cover ON request_rollup_hourly (hour)
    INCLUDE (user_id, model_id, outcome, calls, tokens_in, tokens_out, input_cost, output_cost);
