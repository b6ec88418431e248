import json
import shutil
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from gateway.policy.loader import DEFAULT_POLICY_DIR

POLICY_DIR = DEFAULT_POLICY_DIR
SAMPLES = {
    name: sample
    for path in sorted((POLICY_DIR / "samples").glob("*.json"))
    for name, sample in json.loads(path.read_text()).items()
}


@pytest.fixture
def policy_copy(tmp_path: Path) -> Path:
    """A copy of the repository's policy directory that a test may edit."""
    target = tmp_path / "policies"
    shutil.copytree(POLICY_DIR, target)
    return target


@pytest.fixture(scope="session")
def rsa_key_pem() -> tuple[bytes, bytes]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return _pems(key)


@pytest.fixture(scope="session")
def ec_key_pem() -> tuple[bytes, bytes]:
    return _pems(ec.generate_private_key(ec.SECP256R1()))


def _pems(key) -> tuple[bytes, bytes]:
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return private, public
