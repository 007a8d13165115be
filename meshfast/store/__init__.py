"""PostgreSQL access: connections per role, migrations, and the SQL the app runs."""
