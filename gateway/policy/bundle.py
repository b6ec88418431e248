"""Builds and signs OPA bundles in OPA's own format.

A bundle is a tar.gz holding the policy modules (tests left out), the tenant data as
`tenants/data.json`, a `.manifest` (revision = content digest, roots) and a
`.signatures.json`: one compact JWS (RS256 or ES256) whose `files` claim lists every
file's SHA-256, computed the way OPA verifies it (JSON files hashed over their
key-sorted structure, everything else over its bytes).
"""

import hashlib
import io
import json
import tarfile
from pathlib import Path

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

from gateway.encoding import b64url
from gateway.policy.exceptions import BundleError
from gateway.policy.loader import DEFAULT_POLICY_DIR, load_source

ROOTS = ["tenantgate", "tenants", "system/log"]


def _go_json(value: object) -> str:
    """A JSON primitive as Go's encoder writes it with HTML escaping off."""
    text = json.dumps(value, ensure_ascii=False)
    return text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def _walk(value: object, out: list[str]) -> None:
    # Mirrors OPA's bundle hash walk: objects by sorted key, arrays in order.
    if isinstance(value, dict):
        out.append("{")
        for i, key in enumerate(sorted(value)):
            if i:
                out.append(",")
            out.append(_go_json(key) + ":")
            _walk(value[key], out)
        out.append("}")
    elif isinstance(value, list):
        out.append("[")
        for i, item in enumerate(value):
            if i:
                out.append(",")
            _walk(item, out)
        out.append("]")
    else:
        out.append(_go_json(value))


def file_digest(name: str, content: bytes) -> str:
    base = name.rsplit("/", 1)[-1]
    if base in ("data.json", ".manifest"):
        parts: list[str] = []
        _walk(json.loads(content), parts)
        content = "".join(parts).encode()
    return hashlib.sha256(content).hexdigest()


def sign_files(files: dict[str, bytes], private_key_pem: bytes, key_id: str) -> str:
    """The compact JWS OPA expects in .signatures.json."""
    key = serialization.load_pem_private_key(private_key_pem, password=None)
    if isinstance(key, rsa.RSAPrivateKey):
        alg = "RS256"
    elif isinstance(key, ec.EllipticCurvePrivateKey) and key.curve.name == "secp256r1":
        alg = "ES256"
    else:
        raise BundleError("the signing key must be RSA (RS256) or EC P-256 (ES256)")
    header = {"alg": alg, "kid": key_id, "typ": "JWT"}
    claims = {
        "files": [
            {"name": name, "hash": file_digest(name, content), "algorithm": "SHA-256"}
            for name, content in sorted(files.items())
        ],
        "keyid": key_id,
    }
    signing_input = ".".join(
        b64url(json.dumps(part, separators=(",", ":")).encode()) for part in (header, claims)
    ).encode()
    if alg == "RS256":
        signature = key.sign(signing_input, padding.PKCS1v15(), hashes.SHA256())
    else:
        r, s = decode_dss_signature(key.sign(signing_input, ec.ECDSA(hashes.SHA256())))
        signature = r.to_bytes(32, "big") + s.to_bytes(32, "big")
    return signing_input.decode() + "." + b64url(signature)


def bundle_files(policy_dir: Path = DEFAULT_POLICY_DIR, data_dir: Path | None = None) -> tuple[dict[str, bytes], str]:
    """The bundle's files by path (without signatures) and its revision."""
    source = load_source(policy_dir, data_dir)
    files = {
        Path(path).relative_to(policy_dir).as_posix(): text.encode()
        for path, text in source.modules.items()
    }
    if set(source.data) - {"tenants"}:
        raise BundleError("bundle data may only hold the top-level key 'tenants'")
    files["tenants/data.json"] = json.dumps(
        source.data.get("tenants", {}), sort_keys=True, separators=(",", ":")
    ).encode()
    manifest = {"revision": source.revision, "roots": ROOTS}
    files[".manifest"] = json.dumps(manifest, sort_keys=True).encode()
    return files, source.revision


def build_bundle(
    out: Path,
    private_key_pem: bytes,
    *,
    key_id: str = "tenantgate",
    policy_dir: Path = DEFAULT_POLICY_DIR,
    data_dir: Path | None = None,
) -> str:
    """Writes a signed bundle to out; returns its revision."""
    policy_dir = Path(policy_dir)
    files, revision = bundle_files(policy_dir, data_dir)
    signatures = {"signatures": [sign_files(files, private_key_pem, key_id)]}
    files[".signatures.json"] = json.dumps(signatures).encode()
    write_tarball(out, files)
    return revision


def write_tarball(out: Path, files: dict[str, bytes]) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, content in sorted(files.items()):
            info = tarfile.TarInfo("/" + name)
            info.size = len(content)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(content))
    Path(out).write_bytes(buffer.getvalue())


def read_tarball(path: Path) -> dict[str, bytes]:
    with tarfile.open(path, mode="r:gz") as tar:
        return {
            member.name.lstrip("/"): tar.extractfile(member).read()
            for member in tar.getmembers()
            if member.isfile()
        }
