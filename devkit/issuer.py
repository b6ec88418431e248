"""A local OpenID issuer with Entra ID's URL layout, for development and tests.

It serves discovery and JWKS for v1 and v2 exactly where Entra does, with real RSA keys,
so the gateway's production verification path runs against it unchanged. With a key
directory the signing key is kept on disk (0600), so `tenantgate token` in another
process mints tokens that the running issuer's JWKS verifies.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlencode, urlsplit

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from joserfc import jws
from joserfc.jwk import RSAKey

from engine.paths import default_cache_dir
from gateway.auth.principal import canonical_guid
from gateway.encoding import b64url

if TYPE_CHECKING:
    import uvicorn

DEV_ISSUER_URL_ENV = "TENANTGATE_DEV_ISSUER_URL"
DEFAULT_DEV_ISSUER_URL = "http://127.0.0.1:8401"
DEFAULT_AUDIENCE = "api://tenantgate"
DEV_CLIENT_ID = "0d3c7f5e-6b1a-4c2d-9e8f-7a6b5c4d3e2f"
KEY_FILE = "signing-key.pem"
_MULTI_TENANT = ("common", "organizations", "consumers")
_AUTH_CONTEXT = re.compile(r"c([1-9]|[1-9][0-9])")
_CAPABILITY = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_MAX_CLAIMS_REQUEST = 4096
CODE_TTL_S = 300
_LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")


class ClaimsRequestError(ValueError):
    """A `claims` parameter that is no OIDC claims request the issuer can honour (HTTP 400)."""


def _requested_values(request: object, pattern: re.Pattern[str], name: str) -> list[str]:
    """The value or values an OIDC claims request asks of one claim ({"essential", "value"|"values"})."""
    if not isinstance(request, dict):
        raise ClaimsRequestError(f"the {name} request must be an object")
    values = request.get("values", [request["value"]] if "value" in request else [])
    if not isinstance(values, list) or not values or not all(isinstance(v, str) and pattern.fullmatch(v)
                                                               for v in values):
        raise ClaimsRequestError(f"the {name} request names no value the issuer knows")
    return list(dict.fromkeys(values))


def honour_claims_request(claims: str, *, now: int | None = None) -> dict:
    """The access-token claims a `claims` request parameter asks for, as Entra's authorize and token
    endpoints honour one after a claims challenge: the authentication contexts of `acrs` (this
    issuer satisfies every Conditional Access requirement: the caller is the developer at the
    keyboard), the client capabilities MSAL declares in `xms_cc`, and for `nbf` a token issued, and
    a sign-in made, no earlier than the value asked. Other claims are ignored, as Entra ignores
    claims it does not issue."""
    now = int(time.time()) if now is None else now
    if len(claims) > _MAX_CLAIMS_REQUEST:
        raise ClaimsRequestError("the claims request is too large")
    try:
        document = json.loads(claims)
    except ValueError:
        raise ClaimsRequestError("the claims request is not JSON") from None
    requested = document.get("access_token", {}) if isinstance(document, dict) else None
    if not isinstance(requested, dict):
        raise ClaimsRequestError("the claims request must be an object with an access_token object")
    extra: dict = {"auth_time": now}  # every token the endpoint issues follows a sign-in just now
    if "acrs" in requested:
        extra["acrs"] = _requested_values(requested["acrs"], _AUTH_CONTEXT, "acrs")
    if "xms_cc" in requested:
        extra["xms_cc"] = _requested_values(requested["xms_cc"], _CAPABILITY, "xms_cc")
    if "nbf" in requested:
        value = requested["nbf"].get("value") if isinstance(requested["nbf"], dict) else None
        if not isinstance(value, str) or not value.isdigit():
            raise ClaimsRequestError("the nbf request must carry a value of seconds since the epoch")
        extra["auth_time"] = extra["iat"] = extra["nbf"] = max(now, int(value))
    return extra


def dev_issuer_key_dir() -> Path:
    """`$TENANTGATE_CACHE_DIR/dev-issuer`, else `~/.cache/tenantgate/dev-issuer`."""
    return default_cache_dir() / "dev-issuer"


def _public_jwk(key: rsa.RSAPrivateKey) -> RSAKey:
    return RSAKey.import_key(key.public_key())


def kid_of(key: rsa.RSAPrivateKey) -> str:
    """The RFC 7638 thumbprint of the public key: every process derives the same kid."""
    return _public_jwk(key).thumbprint()


def sign_rs256(header: dict, claims: dict, key: rsa.RSAPrivateKey) -> str:
    """A JWS compact token of exactly this header and these claims, signed with joserfc's RS256.

    The header is signed as it is, also one a verifier must refuse (no alg, crit, b64, a kid
    that is no string: the bad-token corpus signs those), which jws.serialize_compact would check
    and reinterpret; so the compact form is put together here. The one JWS signer in the tree:
    OPA signs the policy bundles."""
    header_json, claims_json = (json.dumps(part, separators=(",", ":")).encode() for part in (header, claims))
    signing_input = f"{b64url(header_json)}.{b64url(claims_json)}"
    # Built directly, not with RSAKey.import_key, which warns about the small keys tests sign with.
    signature = jws.JWSRegistry.algorithms["RS256"].sign(signing_input.encode("ascii"), RSAKey(key, key))
    return f"{signing_input}.{b64url(signature)}"


def _write_private(path: Path, key: rsa.RSAPrivateKey, *, replace: bool) -> None:
    """Writes the key with mode 0600; without replace, a file that exists already wins."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex}")
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as sink:
        sink.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                     serialization.NoEncryption()))
    try:
        if replace:
            os.replace(tmp, path)
        else:
            os.link(tmp, path)  # atomic create-if-absent: two processes never both win
    except FileExistsError:
        pass
    finally:
        tmp.unlink(missing_ok=True)


def _merged(base: dict, changes: dict | None) -> dict:
    """base updated with changes, where a change to None removes the member."""
    for name, value in (changes or {}).items():
        if value is None:
            base.pop(name, None)
        else:
            base[name] = value
    return base


def load_or_create_key(key_dir: Path) -> rsa.RSAPrivateKey:
    path = Path(key_dir) / KEY_FILE
    if not path.exists():
        _write_private(path, rsa.generate_private_key(65537, 2048), replace=False)
    if path.stat().st_mode & 0o077:
        os.chmod(path, 0o600)
    key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    if not isinstance(key, rsa.RSAPrivateKey) or key.key_size < 2048:
        raise ValueError(f"{path}: not an RSA private key of at least 2048 bits")
    return key


class LocalIssuer:
    """Entra-shaped discovery + JWKS on loopback, and a minter for tokens it verifies."""

    def __init__(self, base_url: str | None = None, *, port: int = 0, key_dir: Path | None = None,
                 tls: tuple[Path, Path] | None = None) -> None:
        self._fixed_base_url = base_url.rstrip("/") if base_url else None
        self._port = (urlsplit(base_url).port or 0) if base_url else port
        self._key_dir = Path(key_dir) if key_dir is not None else None
        self._tls = tls  # (certificate, private key) PEM files: serve https, as an authority outside development must
        key = load_or_create_key(self._key_dir) if self._key_dir else rsa.generate_private_key(65537, 2048)
        self._lock = threading.Lock()
        self._keys: dict[str, rsa.RSAPrivateKey] = {kid_of(key): key}
        self.signing_kid = kid_of(key)
        self.jwks_requests = 0
        self.jwks_requests_by_tenant: Counter[str] = Counter()
        self.discovery_requests = 0
        self._codes: dict[str, dict] = {}  # authorization codes not yet redeemed (each once, for CODE_TTL_S)
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    # -- keys ---------------------------------------------------------------------------------

    @property
    def kids(self) -> tuple[str, ...]:
        with self._lock:
            return tuple(self._keys)

    def private_key(self, kid: str | None = None) -> rsa.RSAPrivateKey:
        with self._lock:
            return self._keys[kid or self.signing_kid]

    def rotate(self) -> str:
        """Adds a new key, makes it the signing key (and the persisted one); returns its kid."""
        key = rsa.generate_private_key(65537, 2048)
        if self._key_dir is not None:
            _write_private(self._key_dir / KEY_FILE, key, replace=True)
        with self._lock:
            self._keys[kid_of(key)] = key
            self.signing_kid = kid_of(key)
        return self.signing_kid

    def remove_key(self, kid: str) -> None:
        with self._lock:
            if kid == self.signing_kid or kid not in self._keys:
                raise ValueError("only a published key other than the signing key can be removed")
            del self._keys[kid]

    # -- tokens -------------------------------------------------------------------------------

    def issuer_for(self, tenant_id: str, version: str = "2.0") -> str:
        return f"{self.base_url}/{tenant_id}/v2.0" if _version(version) == "2.0" else f"{self.base_url}/{tenant_id}/"

    def claims(
        self,
        tenant_id: str,
        *,
        object_id: str | None = None,
        app_id: str = DEV_CLIENT_ID,
        scopes: tuple[str, ...] | None = None,
        roles: tuple[str, ...] | None = None,
        app: bool = False,
        version: str = "2.0",
        audience: str = DEFAULT_AUDIENCE,
        lifetime_s: float = 3600,
        extra_claims: dict | None = None,
    ) -> dict:
        """Entra-shaped access-token claims; an extra claim set to None is removed."""
        version, now = _version(version), int(time.time())
        tid = canonical_guid(tenant_id) or tenant_id
        oid = object_id or str(uuid.uuid5(uuid.NAMESPACE_URL, f"tenantgate-dev/{tid}/{'app' if app else 'user'}"))
        claims: dict = {
            "aud": audience,
            "iss": self.issuer_for(tid, version),
            "iat": now,
            "nbf": now,
            "exp": now + int(lifetime_s),
            ("azp" if version == "2.0" else "appid"): app_id,
            ("azpacr" if version == "2.0" else "appidacr"): "1" if app else "0",
            "oid": oid,
            "sub": oid,
            "tid": tid,
            "uti": b64url(os.urandom(16)),
            "ver": version,
        }
        if app:
            claims["idtyp"] = "app"
            claims["roles"] = list(roles if roles is not None else ("Inference.Invoke.All",))
        else:
            scopes = scopes if scopes is not None else ("Inference.Invoke",)
            if scopes:
                claims["scp"] = " ".join(scopes)
            if roles:
                claims["roles"] = list(roles)
        return _merged(claims, extra_claims)

    def mint(self, tenant_id: str, *, headers: dict | None = None, kid: str | None = None, **claim_options) -> str:
        """A signed access token. kid names the signing key; a kid the issuer does not have is
        put in the header of a token signed with the current key. A header set to None is removed."""
        with self._lock:
            key = self._keys.get(kid or self.signing_kid, self._keys[self.signing_kid])
        header = _merged({"typ": "JWT", "alg": "RS256", "kid": kid or self.signing_kid}, headers)
        return sign_rs256(header, self.claims(tenant_id, **claim_options), key)

    # -- server -------------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        if self._fixed_base_url:
            return self._fixed_base_url
        if not self._port:
            raise RuntimeError("the issuer has no URL until it is started")
        return f"{'https' if self._tls else 'http'}://127.0.0.1:{self._port}"

    def start(self, timeout_s: float = 10.0) -> LocalIssuer:
        import uvicorn

        if self._thread is not None:
            return self
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", self._port))
        except OSError:
            sock.close()
            raise
        self._port = sock.getsockname()[1]
        tls: dict[str, Any] = {"ssl_certfile": str(self._tls[0]), "ssl_keyfile": str(self._tls[1])} if self._tls else {}
        config = uvicorn.Config(
            self._app(), log_config=None, log_level=None, access_log=False, lifespan="off", http="h11", ws="none", **tls
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, name="tenantgate-dev-issuer", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("the local issuer did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        server, thread = self._server, self._thread
        self._server = self._thread = None
        if server is None or thread is None:
            return
        server.should_exit = True
        thread.join(10.0)
        if thread.is_alive():
            server.force_exit = True
            thread.join(5.0)

    def __enter__(self) -> LocalIssuer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _app(self):
        # Imported here so the CLI, which only mints, does not load the server stack.
        from starlette.applications import Starlette
        from starlette.responses import JSONResponse, RedirectResponse
        from starlette.routing import Route

        def endpoint(handler):
            async def respond(request):
                tid = request.path_params["tid"]
                tid = tid if tid in _MULTI_TENANT else canonical_guid(tid)
                if tid is None:
                    return JSONResponse({"error": "invalid_tenant", "error_description": "Tenant not found."}, 400)
                return JSONResponse(handler(tid))

            return respond

        async def token(request):
            tid = canonical_guid(request.path_params["tid"])
            body = await request.body()
            try:
                if tid is None:
                    raise ClaimsRequestError("tokens are issued for a tenant GUID, not a multi-tenant alias")
                # A form as OAuth clients post it (parsed here: no multipart parser for one urlencoded body).
                form = {name: values[0] for name, values in parse_qs(body.decode("utf-8", "replace")).items()}
                answer = self.token_response(tid, form, version="2.0" if "v2.0" in request.url.path else "1.0")
            except ClaimsRequestError as exc:
                return JSONResponse({"error": "invalid_request", "error_description": str(exc)}, 400)
            return JSONResponse(answer)

        routes = {
            "/{tid}/v2.0/.well-known/openid-configuration": lambda tid: self._serve_discovery(tid, "2.0"),
            "/{tid}/.well-known/openid-configuration": lambda tid: self._serve_discovery(tid, "1.0"),
            "/{tid}/discovery/v2.0/keys": lambda tid: self._serve_jwks(tid, "2.0"),
            "/{tid}/discovery/keys": lambda tid: self._serve_jwks(tid, "1.0"),
        }
        async def authorize(request):
            tid = canonical_guid(request.path_params["tid"])
            try:
                if tid is None:
                    raise ClaimsRequestError("sign-ins are for a tenant GUID, not a multi-tenant alias")
                location = self.authorize_redirect(tid, dict(request.query_params))
            except ClaimsRequestError as exc:
                return JSONResponse({"error": "invalid_request", "error_description": str(exc)}, 400)
            return RedirectResponse(location, 302)

        token_paths = ("/{tid}/oauth2/v2.0/token", "/{tid}/oauth2/token")
        authorize_paths = ("/{tid}/oauth2/v2.0/authorize", "/{tid}/oauth2/authorize")
        token_routes = [*(Route(path, token, methods=["POST"]) for path in token_paths),
                        *(Route(path, authorize) for path in authorize_paths)]
        return Starlette(routes=[*(Route(path, endpoint(handler)) for path, handler in routes.items()), *token_routes])

    def authorize_redirect(self, tenant_id: str, query: dict[str, str]) -> str:
        """Where the authorize endpoint sends the browser back: the redirect URI with a one-time code
        for the developer who is signed in at once (`login_hint` names them), bound to the client,
        the redirect URI, the PKCE challenge and the `claims` asked for, as Entra's authorize
        endpoint binds them. Redirect URIs are loopback only, so the issuer redirects nowhere else."""
        if query.get("response_type") != "code":
            raise ClaimsRequestError("response_type must be code")
        redirect_uri = query.get("redirect_uri", "")
        target = urlsplit(redirect_uri)
        if target.scheme not in ("http", "https") or target.hostname not in _LOOPBACK_HOSTS:
            raise ClaimsRequestError("redirect_uri must be an http(s) loopback URL")
        if query.get("code_challenge") and query.get("code_challenge_method", "plain") != "S256":
            raise ClaimsRequestError("code_challenge_method must be S256")
        if query.get("claims"):
            honour_claims_request(query["claims"])  # refused here, before any code is issued
        now = time.time()
        self._codes = {code: grant for code, grant in self._codes.items() if grant["expires"] > now}
        code = b64url(os.urandom(32))
        self._codes[code] = {"expires": now + CODE_TTL_S, "tenant_id": tenant_id, "redirect_uri": redirect_uri,
                             "client_id": query.get("client_id", ""), "claims": query.get("claims", ""),
                             "code_challenge": query.get("code_challenge", ""),
                             "username": query.get("login_hint") or f"developer@{tenant_id}"}
        answer = {"code": code, **({"state": query["state"]} if "state" in query else {})}
        return f"{redirect_uri}{'&' if target.query else '?'}{urlencode(answer)}"

    def _redeem(self, tenant_id: str, form: dict[str, str]) -> dict:
        """The sign-in an authorization code stands for, once: the same tenant, client, redirect URI
        and PKCE verifier as the authorize request, within CODE_TTL_S."""
        grant = self._codes.pop(form.get("code", ""), None)
        if grant is None or grant["expires"] < time.time() or grant["tenant_id"] != tenant_id:
            raise ClaimsRequestError("the authorization code is unknown, used or expired")
        if grant["redirect_uri"] != form.get("redirect_uri") or grant["client_id"] != form.get("client_id", ""):
            raise ClaimsRequestError("the code was issued to another client or redirect URI")
        if grant["code_challenge"]:
            verifier = form.get("code_verifier", "").encode()
            if b64url(hashlib.sha256(verifier).digest()) != grant["code_challenge"]:
                raise ClaimsRequestError("the code_verifier does not match the code_challenge")
        return grant

    def token_response(self, tenant_id: str, form: dict[str, str], *, version: str = "2.0") -> dict:
        """The token endpoint's answer to a form: `client_credentials` gets an app-only token,
        `password` and `authorization_code` a delegated one for the user named (no password is
        checked: this issuer signs whatever its own key directory allows anyway). `claims`, sent
        here or to the authorize endpoint, is honoured as Entra honours it after a claims
        challenge (honour_claims_request); `scope` sets the audience (`<audience>/.default`)."""
        grant = form.get("grant_type")
        if grant not in ("client_credentials", "password", "authorization_code"):
            raise ClaimsRequestError("grant_type must be client_credentials, password or authorization_code")
        if grant == "authorization_code":
            signed_in = self._redeem(tenant_id, form)
            form = {**form, "username": signed_in["username"], "claims": form.get("claims") or signed_in["claims"]}
        scope = next((s for s in form.get("scope", "").split() if s.endswith("/.default")), "")
        audience = scope.removesuffix("/.default") or DEFAULT_AUDIENCE
        extra = honour_claims_request(form["claims"]) if form.get("claims") else {"auth_time": int(time.time())}
        options: dict = {"audience": audience, "version": version, "extra_claims": extra}
        if grant != "client_credentials":
            username = form.get("username", "")
            if not username or len(username) > 256:
                raise ClaimsRequestError("a delegated grant needs a username")
            options["object_id"] = str(uuid.uuid5(uuid.NAMESPACE_URL, f"tenantgate-dev/{tenant_id}/user/{username}"))
            # Each token request is a sign-in of its own, so a revoked session ends with it.
            options["extra_claims"] = {"sid": str(uuid.uuid4()), "amr": ["pwd", "mfa"], **extra}
        else:
            options["app"] = True
            extra.pop("auth_time", None)  # an app signs in to no session: Entra's app tokens carry no auth_time
        if form.get("client_id") and canonical_guid(form["client_id"]):
            options["app_id"] = canonical_guid(form["client_id"])
        token = self.mint(tenant_id, **options)
        return {"token_type": "Bearer", "access_token": token, "expires_in": 3600, "ext_expires_in": 3600,
                "scope": scope or f"{audience}/.default"}

    def _serve_discovery(self, tid: str, version: str) -> dict:
        self.discovery_requests += 1
        return self.discovery_document(tid, version)

    def _serve_jwks(self, tid: str, version: str) -> dict:
        self.jwks_requests += 1
        self.jwks_requests_by_tenant[tid] += 1
        return self.jwks_document(version)

    def discovery_document(self, tid: str, version: str = "2.0") -> dict:
        """The OpenID configuration Entra serves for this tenant path and token version."""
        version = _version(version)
        base, v2 = f"{self.base_url}/{tid}", version == "2.0"
        oauth = f"{base}/oauth2/v2.0" if v2 else f"{base}/oauth2"
        # Multi-tenant endpoints publish a template, as Entra's /common does.
        issuer = self.issuer_for("{tenantid}" if tid in _MULTI_TENANT else tid, version)
        return {
            "issuer": issuer,
            "jwks_uri": f"{base}/discovery/v2.0/keys" if v2 else f"{base}/discovery/keys",
            "authorization_endpoint": f"{oauth}/authorize",
            "token_endpoint": f"{oauth}/token",
            "id_token_signing_alg_values_supported": ["RS256"],
            "response_types_supported": ["code", "id_token", "code id_token", "id_token token"],
            "subject_types_supported": ["pairwise"],
        }

    def jwks_document(self, version: str = "2.0") -> dict:
        """The published keys, as Entra's v1 or v2 keys endpoint serves them."""
        version = _version(version)
        with self._lock:
            keys = list(self._keys.items())
        jwks = []
        for kid, key in keys:
            jwk = {**_public_jwk(key).as_dict(private=False), "use": "sig", "kid": kid, "x5t": kid}
            # Entra tags its keys with the v2 issuer template; its v1 endpoint does not.
            if version == "2.0":
                jwk["issuer"] = self.issuer_for("{tenantid}", "2.0")
            jwks.append(jwk)
        return {"keys": jwks}


def _version(version: str) -> str:
    normalized = {"1": "1.0", "1.0": "1.0", "2": "2.0", "2.0": "2.0"}.get(str(version))
    if normalized is None:
        raise ValueError("version must be 1 or 2")
    return normalized
