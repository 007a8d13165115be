-- A cap below one cent rounded to 0 in numeric(12,2), and 0 means "no cap": keep caps exact.
ALTER TABLE user_model_policies ALTER COLUMN daily_cap_usd TYPE numeric(16, 9);
