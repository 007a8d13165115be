"""Workflow budgets' SQL, as named constants with ``$n`` parameters."""

# NOTE: INSERT_WORKFLOW, LIST_WORKFLOWS and GET_WORKFLOW return the same columns.
INSERT_WORKFLOW = """
INSERT INTO workflows (id, limit_nano_usd, "window", principals) VALUES ($1, $2, $3, $4::jsonb)
RETURNING uid, id, limit_nano_usd, "window", principals::text AS principals, created_at
"""
LIST_WORKFLOWS = """
SELECT uid, id, limit_nano_usd, "window", principals::text AS principals, created_at FROM workflows ORDER BY id
"""
GET_WORKFLOW = """
SELECT uid, id, limit_nano_usd, "window", principals::text AS principals, created_at FROM workflows WHERE id = $1
"""
DELETE_WORKFLOW = "DELETE FROM workflows WHERE id = $1 RETURNING uid"
SPENT = "SELECT spend_nano_usd FROM workflow_spend WHERE workflow_uid = $1 AND period = $2"
KNOWN_PRINCIPALS = "SELECT id FROM users WHERE id = ANY($1::uuid[]) AND kind = $2"
# A registry file's workflow (meshfast.admin.service): created, or updated in place by id.
STORED_WORKFLOW = 'SELECT limit_nano_usd, "window", principals::text AS principals FROM workflows WHERE id = $1'
UPDATE_WORKFLOW = """
UPDATE workflows SET limit_nano_usd = $2, "window" = $3, principals = $4::jsonb WHERE id = $1
"""
