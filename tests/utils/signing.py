"""Envelope signing keys for tests, written as an operator mounts them (PEM files)."""

from __future__ import annotations

from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from engine.remote import EnvelopeSigner


def write_key_pair(public_dir: Path, private_dir: Path, name: str) -> EnvelopeSigner:
    """NAME.pub.pem in `public_dir` (what engine servers mount), NAME.pem in `private_dir` (the
    gateway's); returns a signer with the private key."""
    public_dir.mkdir(parents=True, exist_ok=True)
    private_dir.mkdir(parents=True, exist_ok=True)
    key = Ed25519PrivateKey.generate()
    (private_dir / f"{name}.pem").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    (public_dir / f"{name}.pub.pem").write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return EnvelopeSigner(key)
