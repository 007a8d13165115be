-- Organisation data (issue 14, item 1): a user's manager is another user (by id, so a renamed
-- email keeps the chain), beside the business unit and tier that already existed. Users get a
-- version for PUT /admin/users/{id} with If-Match, as providers and models have.
--
-- Invariant: the manager chain never loops. The admin service checks it on every write, under
-- LOCK_ORGANISATION (an advisory lock held to commit), so two writes cannot each pass the check
-- and loop together; the snapshot build refuses a loop as well.
ALTER TABLE users
    ADD COLUMN manager_id uuid REFERENCES users (id) ON DELETE SET NULL,
    ADD COLUMN version integer NOT NULL DEFAULT 1,
    ADD COLUMN updated_at timestamptz NOT NULL DEFAULT now(),
    ADD CONSTRAINT users_not_own_manager CHECK (manager_id IS NULL OR manager_id <> id);
CREATE INDEX users_manager_idx ON users (manager_id) WHERE manager_id IS NOT NULL;

-- The manager was kept as free text; resolve it where it names a user.
UPDATE users u SET manager_id = m.id
FROM users m
WHERE u.manager_email IS NOT NULL AND lower(trim(u.manager_email)) = m.email AND m.id <> u.id;

-- The free text could loop; whoever stands on a loop loses their manager (set it again by hand).
WITH RECURSIVE chain (start_id, id) AS (
    SELECT id, manager_id FROM users WHERE manager_id IS NOT NULL
    UNION
    SELECT c.start_id, u.manager_id FROM chain c JOIN users u ON u.id = c.id WHERE u.manager_id IS NOT NULL
)
UPDATE users SET manager_id = NULL WHERE id IN (SELECT start_id FROM chain WHERE id = start_id);

ALTER TABLE users DROP COLUMN manager_email;
