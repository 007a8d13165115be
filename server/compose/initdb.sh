#!/usr/bin/env bash
# Run by the postgres image on the volume's first start only (/docker-entrypoint-initdb.d):
# meshfast's roles, its two logins and its database, as ../roles.sql says.
psql -v ON_ERROR_STOP=1 --no-psqlrc --username "$POSTGRES_USER" --dbname postgres \
    -v app_password="$MESHFAST_APP_PASSWORD" -v gw_password="$MESHFAST_GW_PASSWORD" \
    -f /meshfast/roles.sql
