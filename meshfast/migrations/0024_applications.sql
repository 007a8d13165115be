-- Applications as principals (issue "identity", item 1). An application is a principal beside
-- people: it holds keys, grants, per-model policies and spend counters exactly as a person does,
-- so it lives in the same table (every key, grant, policy, counter and row that references a
-- principal by users.id keeps working) with kind = 'application': a name (display_name), an owner
-- (a person) and a business unit; no email, manager or tier. The admin API keeps the two apart:
-- /admin/users never shows or changes an application, /admin/applications never a person.
ALTER TABLE users
    ADD COLUMN kind text NOT NULL DEFAULT 'user' CHECK (kind IN ('user', 'application')),
    -- A person who owns applications cannot be deleted until they are given away or deleted.
    ADD COLUMN owner_id uuid REFERENCES users (id) ON DELETE RESTRICT,
    ALTER COLUMN email DROP NOT NULL,
    ADD CONSTRAINT users_kind_shape CHECK (
        (kind = 'user' AND email IS NOT NULL AND owner_id IS NULL)
        OR (kind = 'application' AND email IS NULL AND owner_id IS NOT NULL AND manager_id IS NULL
            AND tier IS NULL AND owner_id <> id));
-- Application names are unique whatever their case (a token's application claim names one).
CREATE UNIQUE INDEX users_application_name_idx ON users (lower(display_name)) WHERE kind = 'application';
CREATE INDEX users_owner_idx ON users (owner_id) WHERE owner_id IS NOT NULL;
