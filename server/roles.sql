-- Run as a superuser when meshfast's own login may not create roles.
CREATE ROLE meshfast_admin NOLOGIN;
CREATE ROLE meshfast_gateway NOLOGIN;
-- The login meshfast connects with (DATABASE_URL) must be a member of both:
-- GRANT meshfast_admin, meshfast_gateway TO meshfast_app;
-- An optional gateway-only login (MESHFAST_GATEWAY_DATABASE_URL):
-- CREATE ROLE meshfast_gw LOGIN PASSWORD '...' IN ROLE meshfast_gateway;
