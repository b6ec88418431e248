"""Builds OPA bundles and has OPA sign them.

A bundle is a tar.gz holding the policy modules (tests left out), the tenant data under
`tenants` and the platform's public prefix segments under `platform_segments`, a `.manifest`
(revision = content digest, roots) and a `.signatures.json`. The
signature is `opa build --signing-key`'s: OPA is what verifies the bundle, so OPA computes the
file hashes it checks (JSON over its key-sorted structure, the rest over its bytes) and signs
them. Without an OPA binary no bundle is built: a signer of our own would have to mirror OPA's
hashing, and a bundle no OPA ever read is one whose release never checked it.
"""

import json
import os
import subprocess
import tempfile
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from gateway.policy.exceptions import BundleError
from gateway.policy.loader import DEFAULT_POLICY_DIR, load_source
from gateway.policy.opa import OPA_VERSION, find_opa

DATA_ROOTS = ("tenants", "platform_segments")
ROOTS = ["tenantgate", *DATA_ROOTS, "system/log"]
OPA_BUILD_TIMEOUT_S = 120.0


def signing_alg(private_key_pem: bytes) -> str:
    """RS256 for an RSA key, ES256 for an EC P-256 key; BundleError for anything else."""
    try:
        key = serialization.load_pem_private_key(private_key_pem, password=None)
    except (ValueError, TypeError):
        raise BundleError("the signing key is not an unencrypted PEM private key") from None
    if isinstance(key, rsa.RSAPrivateKey):
        return "RS256"
    if isinstance(key, ec.EllipticCurvePrivateKey) and key.curve.name == "secp256r1":
        return "ES256"
    raise BundleError("the signing key must be RSA (RS256) or EC P-256 (ES256)")


def bundle_files(policy_dir: Path = DEFAULT_POLICY_DIR, data_dir: Path | None = None) -> tuple[dict[str, bytes], str]:
    """The bundle's files by path (without signatures) and its revision."""
    source = load_source(policy_dir, data_dir)
    files = {
        Path(path).relative_to(policy_dir).as_posix(): text.encode()
        for path, text in source.modules.items()
    }
    if set(source.data) - set(DATA_ROOTS):
        raise BundleError(f"bundle data may only hold the top-level keys {', '.join(DATA_ROOTS)}")
    for root in DATA_ROOTS:
        files[f"{root}/data.json"] = json.dumps(
            source.data.get(root, {}), sort_keys=True, separators=(",", ":")
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
    opa: str | None = None,
) -> str:
    """Writes a bundle signed by `opa build` to out; returns its revision. BundleError when no
    OPA binary is found (opa on PATH or in $(go env GOPATH)/bin) or OPA refuses the bundle."""
    opa = opa or find_opa()
    if opa is None:
        raise BundleError(f"signing a bundle needs OPA {OPA_VERSION} (opa build); run scripts/install-opa.sh first")
    alg = signing_alg(private_key_pem)
    policy_dir = Path(policy_dir)
    files, revision = bundle_files(policy_dir, data_dir)
    with tempfile.TemporaryDirectory(prefix="tenantgate-bundle-") as work:  # mode 0700: it holds the key
        root, key, claims = Path(work) / "bundle", Path(work) / "signing-key.pem", Path(work) / "claims.json"
        for name, content in files.items():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_bytes(content)
        with os.fdopen(os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as sink:
            sink.write(private_key_pem)
        # The payload names the key, so OPA picks the configured key of that id to verify it.
        claims.write_text(json.dumps({"keyid": key_id}))
        command = [opa, "build", "--bundle", ".", "--output", str(Path(out).resolve()),
                   "--signing-key", str(key), "--signing-alg", alg, "--claims-file", str(claims)]
        try:
            result = subprocess.run(command, cwd=root, capture_output=True, text=True, timeout=OPA_BUILD_TIMEOUT_S,
                                    check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise BundleError(f"opa build did not run: {type(exc).__name__}") from None
    if result.returncode != 0:
        reason = next((line.strip() for line in result.stderr.splitlines() if line.strip()), "no output")
        raise BundleError(f"opa build refused the bundle: {reason}")
    return revision
