"""The development commands: `tenantgate token`, and the app `tenantgate serve --dev` serves.

`tenantgate token` prints an access token for calling the gateway.

By default the token is minted for the development issuer with its key from the dev
issuer key directory, so a gateway running in development mode accepts it. With
`--azure` it is a real Microsoft Entra ID token from DefaultAzureCredential.
Only the token goes to stdout: `curl -H "Authorization: Bearer $(tenantgate token ...)"`.

Exit codes: 0 a token was printed, 1 Azure gave no token, 2 unusable arguments or refused.

`serve --dev` builds its app with create_dev_app: the gateway's own app factory, given the
local issuer to start and trust. gateway.main is the one product module that imports this one.
"""

from __future__ import annotations

import argparse
import base64
import os
import re
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

from devkit.issuer import (
    DEFAULT_AUDIENCE,
    DEFAULT_DEV_ISSUER_URL,
    DEV_ISSUER_URL_ENV,
    ClaimsRequestError,
    LocalIssuer,
    dev_issuer_key_dir,
    honour_claims_request,
)
from gateway.auth.principal import canonical_guid
from gateway.policy.exceptions import PolicyError
from gateway.policy.loader import DEFAULT_POLICY_DIR, load_source

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
ENVIRONMENT_ENV = "TENANTGATE_ENVIRONMENT"
AUDIENCE_ENV = "TENANTGATE_AUDIENCE"


_AUTH_CONTEXT = re.compile(r"c([1-9]|[1-9][0-9])")
_AMR = re.compile(r"[a-z0-9_]{1,32}")
_CAPABILITY = re.compile(r"[A-Za-z0-9_.-]{1,64}")


class _UsageError(Exception):
    pass


def create_dev_app(settings, **parts):
    """gateway.app.create_app with the local issuer settings.dev_issuer asks for. Its key is kept in
    the dev issuer key directory, so `tenantgate token` in another shell mints tokens it verifies."""
    from gateway.app import create_app

    issuer = LocalIssuer(port=settings.dev_issuer_port, key_dir=dev_issuer_key_dir()) if settings.dev_issuer else None
    if settings.dev_issuer and settings.mcp_servers_file is None:
        settings = _with_example_mcp_server(settings)
    return create_app(settings, issuer=issuer, **parts)


def _with_example_mcp_server(settings):
    """The settings with an MCP servers file naming devkit's example server (started here, on loopback,
    for the life of the process) as `devtools`: /mcp/devtools. Without the `mcp` package (installed by
    the dev extra) the gateway serves no MCP server, as before."""
    import atexit
    import json
    import logging
    from contextlib import ExitStack

    from engine.paths import default_cache_dir

    try:
        from devkit.mcp_server import serving_example
    except ImportError:
        logging.getLogger("tenantgate.gateway").warning(
            "no /mcp/devtools: the example MCP server needs the mcp package (pip install -e '.[dev]')")
        return settings
    stack = ExitStack()
    example = stack.enter_context(serving_example())
    atexit.register(stack.close)
    path = default_cache_dir() / "dev-mcp-servers.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"servers": [{"name": "devtools", "url": example.url, "tools_ttl_s": 5}]}))
    return settings.model_copy(update={"mcp_servers_file": path})


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("token", help="print an access token for calling the gateway", description=__doc__)
    p.add_argument("--tenant", help="tenant GUID, or a tenant name (or unique prefix of one) from the policy data")
    p.add_argument("--scope", action="append", default=[], help="delegated scope, repeatable (Inference.Invoke)")
    p.add_argument("--role", action="append", default=[], help="app role (repeatable): makes an app-only token")
    p.add_argument("--version", choices=["1", "2"], default="2", help="access token version (default 2)")
    p.add_argument("--audience", help=f"token audience (default ${AUDIENCE_ENV} or {DEFAULT_AUDIENCE})")
    p.add_argument("--object-id", help="the caller's object id (default: a stable one per tenant)")
    p.add_argument("--lifetime", type=int, default=3600, help="seconds until the token expires (default 3600)")
    p.add_argument("--issuer", help=f"dev issuer base URL (default ${DEV_ISSUER_URL_ENV} or {DEFAULT_DEV_ISSUER_URL})")
    p.add_argument("--policy-dir", default=str(DEFAULT_POLICY_DIR), help="where tenant names are looked up")
    p.add_argument("--acrs", action="append", default=[],
                   help="an authentication context the token satisfied (c1..c99), repeatable")
    p.add_argument("--amr", action="append", default=[], help="an authentication method (pwd, mfa...), repeatable")
    p.add_argument("--xms-cc", action="append", default=[],
                   help="a client capability, repeatable: cp1 declares the client follows claims challenges")
    p.add_argument("--auth-time", type=int, help="seconds since the epoch of the sign-in (default: now)")
    p.add_argument("--claims", help="a claims request to honour, as JSON or as the base64 of a challenge's claims=")
    p.add_argument("--azure", action="store_true", help="a real Entra ID token from DefaultAzureCredential")
    p.set_defaults(func=cmd_token)


def cmd_token(args: argparse.Namespace) -> int:
    try:
        token = _azure_token(args) if args.azure else _dev_token(args)
    except _UsageError as exc:
        print(f"tenantgate token: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if token is None:
        return EXIT_FAILED
    print(token)
    return EXIT_OK


def resolve_tenant(value: str, policy_dir: Path = DEFAULT_POLICY_DIR) -> str:
    """A tenant GUID as given, or the GUID of the one tenant whose name is (or starts with) value."""
    guid = canonical_guid(value.strip())
    if guid is not None:
        return guid
    try:
        tenants = load_source(policy_dir).data.get("tenants", {})
    except PolicyError as exc:
        raise _UsageError(f"cannot read tenants: {exc}") from None
    names = {tid: str(tenant.get("name", "")) for tid, tenant in tenants.items() if isinstance(tenant, dict)}
    wanted = value.strip().lower()
    matches = [tid for tid, name in names.items() if name.lower() == wanted]
    if not matches and wanted:
        matches = [tid for tid, name in names.items() if name.lower().startswith(wanted)]
    match = canonical_guid(matches[0]) if len(matches) == 1 else None
    if match:
        return match
    known = ", ".join(sorted(names.values())) or "none"
    problem = "matches more than one tenant" if matches else "is neither a tenant GUID nor a tenant name"
    raise _UsageError(f"--tenant {value!r} {problem} (tenants: {known})")


def _audience(args: argparse.Namespace) -> str:
    return args.audience or os.environ.get(AUDIENCE_ENV) or DEFAULT_AUDIENCE


def _dev_token(args: argparse.Namespace) -> str:
    if os.environ.get(ENVIRONMENT_ENV, "").strip().lower() == "production":
        raise _UsageError(f"refusing to mint a development token with {ENVIRONMENT_ENV}=production (use --azure)")
    if not args.tenant:
        raise _UsageError("--tenant is required")
    if args.scope and args.role:
        raise _UsageError("a token has either --scope (delegated) or --role (app-only), not both")
    if args.object_id is not None and canonical_guid(args.object_id) is None:
        raise _UsageError("--object-id must be a GUID")
    if not 0 < args.lifetime <= 86400:
        raise _UsageError("--lifetime must be 1..86400 seconds")
    tenant_id = resolve_tenant(args.tenant, Path(args.policy_dir))
    extra = _session_claims(args)
    issuer_url = args.issuer or os.environ.get(DEV_ISSUER_URL_ENV) or DEFAULT_DEV_ISSUER_URL
    if urlsplit(issuer_url).scheme not in ("http", "https") or not urlsplit(issuer_url).hostname:
        raise _UsageError(f"the dev issuer URL must be http(s)://host[:port], not {issuer_url!r}")
    try:
        issuer = LocalIssuer(issuer_url, key_dir=dev_issuer_key_dir())
    except (OSError, ValueError) as exc:
        raise _UsageError(f"cannot use the dev issuer: {exc}") from None
    return issuer.mint(
        tenant_id,
        object_id=args.object_id,
        scopes=tuple(args.scope) or None,
        roles=tuple(args.role) or None,
        app=bool(args.role),
        version=args.version,
        audience=_audience(args),
        lifetime_s=args.lifetime,
        extra_claims=extra,
    )


def _session_claims(args: argparse.Namespace) -> dict:
    """The sign-in claims the options ask for (checked as the gateway checks them, so a typo is a
    usage error here, not a claim the gateway silently drops), then any claims request honoured."""
    if args.auth_time is not None and not 0 <= args.auth_time < 10**13:
        raise _UsageError("--auth-time must be seconds since the epoch")
    extra: dict = {}
    if args.auth_time is not None or not args.role:  # a user signed in just now; an app signs in to no session
        extra["auth_time"] = int(time.time()) if args.auth_time is None else args.auth_time
    lists = {"acrs": (args.acrs, _AUTH_CONTEXT), "amr": (args.amr, _AMR), "xms_cc": (args.xms_cc, _CAPABILITY)}
    for name, (values, pattern) in lists.items():
        if any(not pattern.fullmatch(value) for value in values):
            raise _UsageError(f"--{name.replace('_', '-')} values must match {pattern.pattern}")
        if values:
            extra[name] = list(dict.fromkeys(values))
    if args.claims:
        try:
            extra.update(honour_claims_request(_claims_text(args.claims)))
        except ClaimsRequestError as exc:
            raise _UsageError(f"--claims: {exc}") from None
    return extra


def _claims_text(value: str) -> str:
    """A claims request as given: JSON, or the base64 a challenge's claims= parameter carries."""
    value = value.strip()
    if value.startswith("{"):
        return value
    try:
        altchars = b"-_" if "-" in value or "_" in value else None  # base64url too, as azure-core reads it
        return base64.b64decode(value + "=" * (-len(value) % 4), altchars=altchars, validate=True).decode("utf-8")
    except (ValueError, UnicodeDecodeError):
        raise _UsageError("--claims is neither JSON nor base64 of JSON") from None


def _azure_token(args: argparse.Namespace) -> str | None:
    if args.role:
        raise _UsageError("--role is for development tokens; Entra ID assigns app roles")
    tenant_id = resolve_tenant(args.tenant, Path(args.policy_dir)) if args.tenant else None
    scopes = args.scope or [f"{_audience(args)}/.default"]
    try:
        from azure.identity import DefaultAzureCredential
    except ImportError:
        print("tenantgate token: --azure needs the azure-identity package", file=sys.stderr)
        return None
    options = {"additionally_allowed_tenants": [tenant_id]} if tenant_id else {}
    credential = None
    try:
        credential = DefaultAzureCredential(**options)
        return credential.get_token(*scopes, tenant_id=tenant_id).token
    except Exception as exc:  # noqa: BLE001 - azure-identity raises many kinds; each is reported as no token
        # Azure's messages span many lines of hints; the first says what went wrong.
        reason = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        print(f"tenantgate token: no Azure token: {reason}", file=sys.stderr)
        return None
    finally:
        if credential is not None:
            credential.close()
