-- meshfast's roles, its two logins and its database, for a DBA who does not give meshfast a
-- superuser. (With a superuser DATABASE_URL, meshfast creates the two roles itself and grants
-- them to that login; nothing here is needed.)
--
-- Run once as a superuser (or a role with CREATEROLE and CREATEDB), with psql:
--
--   psql -v ON_ERROR_STOP=1 -v app_password='...' -v gw_password='...' \
--        -f roles.sql postgresql://postgres@db.example.com/postgres
--
-- then give meshfast:
--
--   DATABASE_URL=postgresql://meshfast_app:<app_password>@db.example.com/meshfast
--   MESHFAST_GATEWAY_DATABASE_URL=postgresql://meshfast_gw:<gw_password>@db.example.com/meshfast
--
-- Running it again creates nothing twice and sets the two passwords again. Hex passwords
-- (`openssl rand -hex 24`) need no escaping in a URL.
\set ON_ERROR_STOP on

-- The two roles. meshfast assumes one of them on every connection (the `role` setting at
-- connect time), and every table's row-level security policies and grants name them.
SELECT 'CREATE ROLE meshfast_admin NOLOGIN'
WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'meshfast_admin') \gexec
SELECT 'CREATE ROLE meshfast_gateway NOLOGIN'
WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'meshfast_gateway') \gexec

-- meshfast_app, the DATABASE_URL login. It must be a member of both roles: the supervisor and
-- the admin plane act as meshfast_admin, the counters' seed and checkpoint as meshfast_gateway.
-- It owns the database, so `meshfast migrate` can create the schema (tables, policies, and the
-- grants to both roles); the tables belong to it.
SELECT 'CREATE ROLE meshfast_app LOGIN'
WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'meshfast_app') \gexec
ALTER ROLE meshfast_app WITH LOGIN NOSUPERUSER NOCREATEROLE NOCREATEDB PASSWORD :'app_password';
GRANT meshfast_admin, meshfast_gateway TO meshfast_app;

-- meshfast_gw, the MESHFAST_GATEWAY_DATABASE_URL login: a member of meshfast_gateway only. The
-- workers' data plane (snapshot reads, request rows, counters, cluster leases and heartbeats)
-- and the LISTEN connection use it, so a leak of this password cannot change configuration.
SELECT 'CREATE ROLE meshfast_gw LOGIN'
WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'meshfast_gw') \gexec
ALTER ROLE meshfast_gw WITH LOGIN NOSUPERUSER NOCREATEROLE NOCREATEDB PASSWORD :'gw_password';
GRANT meshfast_gateway TO meshfast_gw;

SELECT 'CREATE DATABASE meshfast OWNER meshfast_app'
WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = 'meshfast') \gexec

-- Only meshfast's two logins connect; only the owner creates objects. (PostgreSQL 15+ already
-- refuses CREATE on the public schema to others; 14 grants it to everyone.)
REVOKE ALL ON DATABASE meshfast FROM PUBLIC;
GRANT CONNECT ON DATABASE meshfast TO meshfast_app, meshfast_gw;
\connect meshfast
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
GRANT USAGE, CREATE ON SCHEMA public TO meshfast_app;
