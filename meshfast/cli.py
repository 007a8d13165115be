"""The ``meshfast`` command."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import getpass
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from meshfast import __version__
from meshfast.settings import ENV_DOC

if TYPE_CHECKING:
    from meshfast.admin.service import AdminService, Registry


def _env_epilog() -> str:
    width = max(len(name) for name, _ in ENV_DOC)
    lines = ["environment:"]
    lines += [f"  {name.ljust(width)}  {text}" for name, text in ENV_DOC]
    lines += [
        "",
        "With no DATABASE_URL, meshfast runs an embedded PostgreSQL in MESHFAST_DATA_DIR/pg.",
        "Production uses DATABASE_URL with password authentication.",
    ]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    fmt = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(
        prog="meshfast",
        description="meshfast: a governed LLM gateway.",
        epilog=_env_epilog(),
        formatter_class=fmt,
    )
    parser.add_argument("--version", action="version", version=f"meshfast {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    serve = commands.add_parser(
        "serve", help="run the gateway (supervisor + Granian workers)", epilog=_env_epilog(), formatter_class=fmt,
        description="Run the gateway: first-run secrets, database, migrations, then N Granian workers.",
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8080, help="port to listen on (default 8080)")
    serve.add_argument("--workers", type=int, default=1, help="worker processes (default 1)")
    serve.add_argument("--demo", action="store_true",
                       help="also run testserve (emulated providers) and seed demo providers, models and a user")
    serve.add_argument("--demo-port", type=int, default=9100, help="testserve port for --demo (default 9100)")
    serve.add_argument("--join", action="store_true",
                       help="join a cluster: apply no migrations, refuse a database whose schema is not this build's")
    serve.add_argument("--registry", metavar="FILE",
                       help="apply a registry file (as `meshfast apply`) first; an invalid one stops the start")

    commands.add_parser(
        "migrate", help="apply pending database migrations and exit", epilog=_env_epilog(), formatter_class=fmt,
        description="Create the meshfast roles if needed and apply the shipped migrations.",
    )

    apply = commands.add_parser(
        "apply", help="create or update providers, models and deployments from a registry file",
        epilog=_env_epilog(), formatter_class=fmt,
        description="Validate a registry file (JSON, or TOML by its .toml suffix) as a whole and apply it "
                    "in one transaction: every problem is listed and nothing is written when it is invalid. "
                    "Entities are matched by name; applying a file again changes nothing. A provider's key "
                    "may come from the environment: \"api_key_env\": \"VARIABLE\".",
    )
    apply.add_argument("file", help="the registry file")
    apply.add_argument("--json", action="store_true", help="print the result as JSON")

    users = commands.add_parser("users", help="manage callers (users and their keys)", formatter_class=fmt,
                                epilog=_env_epilog())
    user_commands = users.add_subparsers(dest="users_command", metavar="ACTION", required=True)
    create = user_commands.add_parser("create", help="create a user and print its key (shown once)")
    create.add_argument("--email", required=True)
    create.add_argument("--display-name", required=True)
    create.add_argument("--manager-email")
    create.add_argument("--business-unit")
    create.add_argument("--tier")
    create.add_argument("--json", action="store_true", help="print the result as JSON")
    rotate = user_commands.add_parser("rotate-key", help="revoke a user's key and print a new one")
    rotate.add_argument("user_id")
    rotate.add_argument("--json", action="store_true")
    revoke = user_commands.add_parser("revoke", help="revoke a user and all its keys")
    revoke.add_argument("user_id")
    revoke.add_argument("--json", action="store_true")
    listing = user_commands.add_parser("list", help="list users")
    listing.add_argument("--json", action="store_true")
    add_key = user_commands.add_parser("add-key", help="issue a user a named key and print it (shown once)")
    add_key.add_argument("user_id")
    add_key.add_argument("--name", required=True)
    add_key.add_argument("--expires-at", help="RFC 3339 with its offset, e.g. 2027-01-31T00:00:00Z")
    add_key.add_argument("--model", action="append", dest="models", metavar="MODEL_ID",
                         help="limit the key to this model (repeat for several; none: every granted model)")
    add_key.add_argument("--json", action="store_true")
    keys = user_commands.add_parser("keys", help="list a user's keys (prefixes only)")
    keys.add_argument("user_id")
    keys.add_argument("--json", action="store_true")
    rotate_one = user_commands.add_parser("rotate", help="replace one key; the old one works --overlap-s more")
    rotate_one.add_argument("key_id")
    rotate_one.add_argument("--overlap-s", type=int, default=0)
    rotate_one.add_argument("--json", action="store_true")
    revoke_key = user_commands.add_parser("revoke-key", help="revoke one key at once")
    revoke_key.add_argument("key_id")
    revoke_key.add_argument("--json", action="store_true")
    issuers = commands.add_parser("issuers", help="platform token (JWT) issuers the data plane trusts",
                                  formatter_class=fmt, epilog=_env_epilog())
    issuer_commands = issuers.add_subparsers(dest="issuers_command", metavar="ACTION", required=True)
    add_issuer = issuer_commands.add_parser("add", help="trust an issuer (its key set inline or fetched from a URL)")
    add_issuer.add_argument("--issuer", required=True, help="the tokens' iss")
    add_issuer.add_argument("--audience", action="append", dest="audiences", required=True,
                            help="an accepted aud (repeat for several)")
    add_issuer.add_argument("--algorithm", action="append", dest="algorithms", required=True,
                            choices=("RS256", "ES256", "EdDSA"), help="an allowed algorithm (repeat for several)")
    source = add_issuer.add_mutually_exclusive_group(required=True)
    source.add_argument("--jwks-url", help="fetched in the background (https; --local for a private address)")
    source.add_argument("--jwks-file", help="a JWK Set file (public keys)")
    add_issuer.add_argument("--claim", action="append", default=[], metavar="ATTRIBUTE=CLAIM",
                            help="which claim holds email (default: email), display_name, business_unit, "
                                 "manager_email, tier, application")
    add_issuer.add_argument("--clock-skew-s", type=int, default=60)
    add_issuer.add_argument("--jit", action="store_true", help="provision unknown people from their claims")
    add_issuer.add_argument("--local", action="store_true", help="the JWKS URL may be a private address")
    add_issuer.add_argument("--json", action="store_true")
    issuer_list = issuer_commands.add_parser("list", help="list issuers and their keys")
    issuer_list.add_argument("--json", action="store_true")
    remove_issuer = issuer_commands.add_parser("remove", help="stop trusting an issuer")
    remove_issuer.add_argument("issuer_id")
    remove_issuer.add_argument("--json", action="store_true")
    workflows = commands.add_parser("workflows", help="workflow budgets (calls tagged workflow=<id>)",
                                    formatter_class=fmt, epilog=_env_epilog())
    workflow_commands = workflows.add_subparsers(dest="workflows_command", metavar="ACTION", required=True)
    add_workflow = workflow_commands.add_parser("add", help="register a workflow budget")
    add_workflow.add_argument("id", help="the workflow tag's value")
    add_workflow.add_argument("--limit-usd", required=True)
    add_workflow.add_argument("--window", required=True, choices=("daily", "weekly", "monthly"))
    add_workflow.add_argument("--user", action="append", default=[], metavar="USER_ID",
                              help="a person who may charge it (repeat; none of --user/--business-unit: anyone)")
    add_workflow.add_argument("--application", action="append", default=[], metavar="APPLICATION_ID",
                              help="an application that may (repeat)")
    add_workflow.add_argument("--business-unit", action="append", default=[], help="a business unit that may")
    add_workflow.add_argument("--json", action="store_true")
    workflow_list = workflow_commands.add_parser("list", help="list workflows and their spend")
    workflow_list.add_argument("--json", action="store_true")
    remove_workflow = workflow_commands.add_parser("remove", help="unregister a workflow")
    remove_workflow.add_argument("id")
    remove_workflow.add_argument("--json", action="store_true")
    applications = commands.add_parser("applications", help="applications: principals with their own keys",
                                       formatter_class=fmt, epilog=_env_epilog())
    application_commands = applications.add_subparsers(dest="applications_command", metavar="ACTION", required=True)
    add_application = application_commands.add_parser("add", help="register an application (prints its key once)")
    add_application.add_argument("name")
    add_application.add_argument("--owner", required=True, help="the owner's email or user id")
    add_application.add_argument("--business-unit")
    add_application.add_argument("--json", action="store_true")
    application_list = application_commands.add_parser("list", help="list applications")
    application_list.add_argument("--json", action="store_true")
    grant_application = application_commands.add_parser("grant", help="grant an application a model")
    grant_application.add_argument("application", help="its name or id")
    grant_application.add_argument("model_id")
    grant_application.add_argument("--json", action="store_true")
    remove_application = application_commands.add_parser("remove", help="delete an application and its keys")
    remove_application.add_argument("application", help="its name or id")
    remove_application.add_argument("--json", action="store_true")
    admins = commands.add_parser("admins", help="dashboard logins", formatter_class=fmt, epilog=_env_epilog())
    admin_commands = admins.add_subparsers(dest="admins_command", metavar="ACTION", required=True)
    make_admin = admin_commands.add_parser(
        "create", help="create a dashboard login (the password is read from MESHFAST_ADMIN_PASSWORD or asked)")
    make_admin.add_argument("--email", required=True)
    make_admin.add_argument("--super", action="store_true", help="may trip the kill switch and manage admins")
    make_admin.add_argument("--json", action="store_true")
    admin_list = admin_commands.add_parser("list", help="list dashboard logins")
    admin_list.add_argument("--json", action="store_true")
    return parser


def _summary(applied: dict[str, list[str]]) -> str:
    return ", ".join(f"{len(names)} {what}" for what, names in applied.items())


def _print(result: Any, as_json: bool) -> None:
    if as_json:
        print(json.dumps(result, indent=None, default=str))
        return
    if isinstance(result, list):
        for row in result:
            print("  ".join(f"{k}={v}" for k, v in row.items()))
        return
    for key, value in result.items():
        print(f"{key}: {value}")


@contextlib.asynccontextmanager
async def _admin_service() -> AsyncIterator[AdminService]:
    """The admin service on this instance's database (started and migrated if embedded).
    Running workers see its writes through the database's NOTIFY, as the admin API's."""
    from meshfast.admin import service as svc
    from meshfast.secrets import load_or_create
    from meshfast.settings import Settings
    from meshfast.store import database
    from meshfast.supervisor import Database

    settings = Settings.from_env()
    secrets = load_or_create(settings.secrets_path)
    with Database(settings) as db:
        await database.migrate(db.url)
        pool = await database.create_pool(db.url, role=database.ADMIN_ROLE, min_size=1, max_size=1)

        async def no_rebuild(_seq: int, _change: str) -> None:
            return None

        try:
            yield svc.AdminService(pool, secrets, no_rebuild)
        finally:
            await pool.close()


def _read_registry(path: str) -> Registry:
    """The registry file at ``path``, validated on its own; exits listing every problem."""
    from meshfast import errors
    from meshfast.admin import service as svc

    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise SystemExit(f"meshfast: cannot read {path}: {exc.strerror}") from None
    try:
        return svc.parse_registry(data, "toml" if path.endswith(".toml") else "json", os.environ)
    except errors.MeshfastError as exc:
        raise SystemExit(_invalid_registry(path, exc)) from None


def _invalid_registry(path: str, exc: Exception) -> str:
    problems = getattr(exc, "extra", {}).get("errors") or [getattr(exc, "detail", None) or str(exc)]
    return "\n".join([f"meshfast: {path}: invalid registry, nothing applied:", *(f"  - {p}" for p in problems)])


async def _apply(path: str, registry: Registry) -> dict[str, list[str]]:
    from meshfast import errors

    async with _admin_service() as service:
        try:
            return await service.apply_registry("cli", registry, path)
        except errors.MeshfastError as exc:
            raise SystemExit(_invalid_registry(path, exc)) from None


async def _users(args: argparse.Namespace) -> Any:
    from meshfast import errors, validate
    from meshfast.admin import service as svc

    async with _admin_service() as service:
        try:
            if args.users_command == "create":
                body = validate.convert({
                    "email": args.email, "display_name": args.display_name, "manager_email": args.manager_email,
                    "business_unit": args.business_unit, "tier": args.tier,
                }, svc.UserCreate)
                return await service.create_user("cli", body)
            if args.users_command == "rotate-key":
                return await service.rotate_key("cli", args.user_id)
            if args.users_command == "revoke":
                return await service.revoke_user("cli", args.user_id)
            if args.users_command == "add-key":
                key_body = validate.convert({"name": args.name, "expires_at": args.expires_at, "models": args.models},
                                            svc.KeyCreate)
                return await service.create_key("cli", args.user_id, key_body)
            if args.users_command == "keys":
                return await service.list_keys(args.user_id)
            if args.users_command == "rotate":
                return await service.rotate_key_by_id("cli", args.key_id,
                                                      validate.convert({"overlap_s": args.overlap_s}, svc.KeyRotate))
            if args.users_command == "revoke-key":
                return await service.revoke_key("cli", args.key_id)
            return await service.list_users()
        except errors.MeshfastError as exc:
            raise _refused(exc) from None


def _refused(exc: Any) -> SystemExit:
    """An admin service's refusal as the CLI's exit: the code and its detail."""
    return SystemExit(f"meshfast: {exc.code}" + (f": {exc.detail}" if exc.detail else ""))


async def _issuers(args: argparse.Namespace) -> Any:
    from meshfast import errors, validate
    from meshfast.admin import issuers

    async with _admin_service() as service:
        trusted = issuers.IssuerService(service._pool, service._write)
        try:
            if args.issuers_command == "add":
                claims = {"email": "email"}
                for pair in args.claim:
                    attribute, sep, claim = pair.partition("=")
                    if not sep:
                        raise SystemExit(f"meshfast: --claim {pair!r} is not ATTRIBUTE=CLAIM")
                    claims[attribute.strip()] = claim.strip()
                jwks = None
                if args.jwks_file:
                    try:
                        jwks = json.loads(Path(args.jwks_file).read_text())
                    except (OSError, ValueError) as exc:
                        raise SystemExit(f"meshfast: cannot read {args.jwks_file}: {exc}") from None
                body = validate.convert({
                    "issuer": args.issuer, "audiences": args.audiences, "algorithms": args.algorithms,
                    "claims": claims, "jwks_url": args.jwks_url, "jwks": jwks, "clock_skew_s": args.clock_skew_s,
                    "jit_provisioning": args.jit, "local": args.local}, issuers.IssuerCreate)
                return await trusted.create("cli", body)
            if args.issuers_command == "remove":
                return await trusted.delete("cli", args.issuer_id)
            return await trusted.list()
        except errors.MeshfastError as exc:
            raise _refused(exc) from None


async def _workflows(args: argparse.Namespace) -> Any:
    from meshfast import errors, validate
    from meshfast.admin import workflows

    async with _admin_service() as service:
        budgets = workflows.WorkflowService(service._pool, service._write)
        try:
            if args.workflows_command == "add":
                listed = ([{"user_id": u} for u in args.user] + [{"application_id": a} for a in args.application]
                          + [{"business_unit": b} for b in args.business_unit])
                body = validate.convert({"id": args.id, "limit_usd": args.limit_usd, "window": args.window,
                                         "principals": listed or None}, workflows.WorkflowCreate)
                return await budgets.create("cli", body)
            if args.workflows_command == "remove":
                return await budgets.delete("cli", args.id)
            return await budgets.list()
        except errors.MeshfastError as exc:
            raise _refused(exc) from None


async def _applications(args: argparse.Namespace) -> Any:
    from meshfast import errors, validate
    from meshfast.admin import applications
    from meshfast.admin import service as svc
    from meshfast.store import sql

    async with _admin_service() as service:
        apps = applications.ApplicationService(service._pool, service._secrets, service._write, svc.label)
        try:
            if args.applications_command == "add":
                owner = args.owner
                if "@" in owner:
                    async with service._pool.acquire() as conn:
                        found = await conn.fetchval(sql.USER_ID_TEXT_BY_EMAIL, owner.strip().lower())
                    if found is None:
                        raise SystemExit(f"meshfast: no user has the email {owner}")
                    owner = found
                body = validate.convert({"name": args.name, "owner_id": owner, "business_unit": args.business_unit},
                                        applications.ApplicationCreate)
                return await apps.create("cli", body)
            if args.applications_command == "list":
                return await apps.list()
            wanted = args.application.strip().lower()
            app = next((a for a in await apps.list() if wanted in (a["id"], a["name"].lower())), None)
            if app is None:
                raise SystemExit(f"meshfast: no application is named {args.application}")
            if args.applications_command == "grant":
                grant = validate.convert({"application_id": app["id"], "model_id": args.model_id}, svc.AccessBody)
                return await service.grant("cli", grant)
            return await apps.delete("cli", app["id"])
        except errors.MeshfastError as exc:
            raise _refused(exc) from None


async def _admins(args: argparse.Namespace) -> Any:
    from meshfast import errors, validate
    from meshfast.admin import auth

    async with _admin_service() as service:
        logins = auth.AdminAuth(service._pool)  # the service's one-connection pool
        try:
            if args.admins_command == "create":
                password = os.environ.get("MESHFAST_ADMIN_PASSWORD") or getpass.getpass("password: ")
                body = validate.convert({"email": args.email, "password": password, "is_super": args.super},
                                        auth.AdminCreate)
                return await logins.create_admin("cli", True, body)
            return await logins.list_admins()
        except errors.MeshfastError as exc:
            raise _refused(exc) from None


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    if args.command == "serve":
        from meshfast.supervisor import ServeOptions, serve

        if args.workers < 1:
            parser.error("--workers must be at least 1")
        if args.registry:
            # NOTE: before anything starts: an invalid registry refuses the start with every problem.
            applied = asyncio.run(_apply(args.registry, _read_registry(args.registry)))
            print(f"meshfast: registry {args.registry}: " + _summary(applied), flush=True)
        return serve(ServeOptions(host=args.host, port=args.port, workers=args.workers, demo=args.demo,
                                  demo_port=args.demo_port, join=args.join))
    if args.command == "migrate":
        from meshfast.supervisor import migrate_only

        return migrate_only()
    if args.command == "apply":
        applied = asyncio.run(_apply(args.file, _read_registry(args.file)))
        if args.json:
            _print(applied, True)
        else:
            print(f"meshfast: {args.file}: " + _summary(applied))
            for what in ("created", "updated", "deleted"):
                for name in applied[what]:
                    print(f"  {what} {name}")
        return 0
    if args.command == "users":
        _print(asyncio.run(_users(args)), args.json)
        return 0
    if args.command == "admins":
        _print(asyncio.run(_admins(args)), args.json)
        return 0
    if args.command == "issuers":
        _print(asyncio.run(_issuers(args)), args.json)
        return 0
    if args.command == "workflows":
        _print(asyncio.run(_workflows(args)), args.json)
        return 0
    if args.command == "applications":
        _print(asyncio.run(_applications(args)), args.json)
        return 0
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
