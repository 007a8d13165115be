-- The snapshot's sequence number must count committed writes only: a sequence's last_value
-- also shows writes still in flight, so a rebuild could claim to cover a write it cannot see.
-- Every admin write now stores its number here, in its own transaction.
ALTER TABLE gateway_state ADD COLUMN config_seq bigint NOT NULL DEFAULT 0;
-- NOTE: a sequence never called reports last_value 1 although nextval will return 1 too; the
-- stored number must stay below the next write's.
UPDATE gateway_state SET config_seq = (
    SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM meshfast_config_seq);
