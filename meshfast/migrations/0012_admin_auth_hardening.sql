-- An admin token acts on the authority of the admin who minted it, from a session or through a
-- token of theirs: it is refused while that admin is paused and once they are deleted, so a pause
-- cannot be side-stepped with a token made beforehand. NULL: the bootstrap token and the tokens
-- minted through it, which only a revocation ends. No foreign key: a deleted owner leaves the id
-- behind, and a token whose owner is gone is refused.
ALTER TABLE admin_tokens ADD COLUMN owner_admin_id uuid;
UPDATE admin_tokens t SET owner_admin_id = a.id FROM admins a WHERE t.created_by = a.email;
