-- Several keys per person (issue "identity", item 2): named keys with an optional expiry and an
-- optional model subset, rotated with an overlap. The key made with the user (and replaced by
-- POST /admin/users/{id}/rotate-key) is the primary key: no name.
ALTER TABLE mesh_api_keys
    ADD COLUMN name        text CHECK (name IS NULL OR length(name) BETWEEN 1 AND 64),
    -- NULL: every model the person is granted; else only these (a deleted model drops out).
    ADD COLUMN models      uuid[],
    -- Set on a key rotated away from: it works until its expires_at (the overlap), then never.
    ADD COLUMN replaced_by uuid REFERENCES mesh_api_keys (id) ON DELETE SET NULL;

DROP INDEX mesh_api_keys_one_active_idx;
-- One current primary key per person, and one current key of each name.
CREATE UNIQUE INDEX mesh_api_keys_one_primary_idx ON mesh_api_keys (user_id)
    WHERE status = 'active' AND name IS NULL AND replaced_by IS NULL;
CREATE UNIQUE INDEX mesh_api_keys_one_per_name_idx ON mesh_api_keys (user_id, name)
    WHERE status = 'active' AND name IS NOT NULL AND replaced_by IS NULL;
