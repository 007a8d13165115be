-- The snapshot's sequence number must count committed writes only: a sequence's last_value
-- also shows writes still in flight, so a rebuild could claim to cover a write it cannot see.
-- Every admin write now stores its number here, in its own transaction.
ALTER TABLE gateway_state ADD COLUMN config_seq bigint NOT NULL DEFAULT 0;
UPDATE gateway_state SET config_seq = (SELECT last_value FROM meshfast_config_seq);
