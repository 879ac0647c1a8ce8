"""Signed approvals (docs/design.md#signed-approvals): an approver's Ed25519 key signs what they approved.

The signed bytes are the RFC 8785 canonical JSON (:func:`atmostonce.identity.canonical_json`) of one
object::

    {"domain": "atmostonce.approval.v1", "key": <intent key>, "request_digest": <hex>, "account": <str>,
     "target": <str>, "target_version": <int>, "expires_at": <float, database-clock seconds>,
     "approver": <str>, "signing_key_id": <str>}

The domain tag keeps a signature over these bytes from meaning anything in another protocol. A key id is
``"ed25519:"`` followed by the first 32 hex digits of SHA-256 over the 32 raw public-key bytes; public keys
are stored as 64 hex digits, signatures as 128. Private keys live in files (PKCS#8 PEM, mode 0600) and never
reach a store.
"""

from __future__ import annotations

import hashlib
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from .errors import IntakeError
from .identity import canonical_json

__all__ = [
    "DOMAIN",
    "SIGNED_FIELDS",
    "SignedApproval",
    "approval_payload",
    "key_id",
    "load_private_key",
    "new_private_key",
    "parse_public_key",
    "public_key_hex",
    "public_key_pem",
    "sign_approval",
    "verify_approval",
    "write_private_key",
]

DOMAIN = "atmostonce.approval.v1"
SIGNED_FIELDS = ("key", "request_digest", "account", "target", "target_version", "expires_at", "approver")
"""The approval fields a signature covers (besides the domain tag and the signing key id)."""


@dataclass(frozen=True)
class SignedApproval:
    """What ``approve(..., signed=...)`` stores beside the approval: the key id, the signature (hex) and
    the absolute expiry (database-clock seconds) and target version the signature covers."""

    signing_key_id: str
    signature: str
    expires_at: float
    target_version: int


def approval_payload(fields: Any, signing_key_id: str) -> bytes:
    """The canonical bytes signed for an approval; ``fields`` is a mapping or an object with
    :data:`SIGNED_FIELDS` (an :class:`~atmostonce.records.Approval`). Raises ``IdentityError`` for
    values with no canonical form."""
    get = fields.get if isinstance(fields, dict) else lambda n: getattr(fields, n)
    obj: dict[str, Any] = {n: get(n) for n in SIGNED_FIELDS}
    obj["expires_at"] = float(obj["expires_at"])
    return canonical_json({"domain": DOMAIN, "signing_key_id": signing_key_id, **obj})


def public_key_hex(key: Ed25519PublicKey | Ed25519PrivateKey) -> str:
    pub = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
    return pub.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw).hex()


def public_key_pem(key: Ed25519PrivateKey) -> str:
    return (
        key.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode("ascii")
    )


def key_id(public_hex: str) -> str:
    """The id of a public key given as 64 hex digits."""
    return "ed25519:" + hashlib.sha256(bytes.fromhex(public_hex)).hexdigest()[:32]


def parse_public_key(text: str) -> str:
    """A public key from a PEM block (SubjectPublicKeyInfo) or 64 hex digits; returns the 64 hex digits.
    Raises ``IntakeError`` for anything else."""
    text = text.strip()
    try:
        if text.startswith("-----BEGIN"):
            pub = serialization.load_pem_public_key(text.encode("ascii"))
            if not isinstance(pub, Ed25519PublicKey):
                raise IntakeError("the public key is not an Ed25519 key")
            return public_key_hex(pub)
        raw = bytes.fromhex(text)
        Ed25519PublicKey.from_public_bytes(raw)
        return raw.hex()
    except (ValueError, TypeError) as exc:
        raise IntakeError(f"not an Ed25519 public key (PEM or 64 hex digits): {exc}") from exc


def new_private_key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


def write_private_key(key: Ed25519PrivateKey, path: str | os.PathLike[str]) -> None:
    """Write ``key`` as unencrypted PKCS#8 PEM to a new file with mode 0600 (refuses to overwrite)."""
    data = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def load_private_key(path: str | os.PathLike[str]) -> Ed25519PrivateKey:
    """Read a PKCS#8 PEM Ed25519 private key; ``IntakeError`` if it is not one."""
    try:
        key = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
    except (ValueError, TypeError) as exc:
        raise IntakeError(f"{path}: not a private key file: {exc}") from exc
    if not isinstance(key, Ed25519PrivateKey):
        raise IntakeError(f"{path}: not an Ed25519 private key")
    return key


def sign_approval(
    private_key: Ed25519PrivateKey,
    *,
    key: str,
    request_digest: str,
    account: str,
    target: str,
    target_version: int,
    expires_at: float,
    approver: str,
) -> SignedApproval:
    """Sign an approval of these fields. ``expires_at`` (database-clock seconds) is rounded down to a whole
    second, so it survives every store's float column and JSON exactly."""
    kid = key_id(public_key_hex(private_key))
    fields: dict[str, Any] = {
        "key": key,
        "request_digest": request_digest,
        "account": account,
        "target": target,
        "target_version": target_version,
        "expires_at": float(math.floor(expires_at)),
        "approver": approver,
    }
    sig = private_key.sign(approval_payload(fields, kid)).hex()
    return SignedApproval(kid, sig, fields["expires_at"], target_version)


def verify_approval(public_hex: str, approval: Any) -> bool:
    """Whether ``approval`` (an :class:`~atmostonce.records.Approval`) carries a valid signature by the key
    ``public_hex`` over its own fields and key id. Never raises for a bad or missing signature."""
    sig, kid = getattr(approval, "signature", None), getattr(approval, "signing_key_id", None)
    if not sig or not kid or kid != key_id(public_hex):
        return False
    try:
        Ed25519PublicKey.from_public_bytes(bytes.fromhex(public_hex)).verify(
            bytes.fromhex(sig), approval_payload(approval, kid)
        )
    except (InvalidSignature, ValueError, TypeError):
        return False
    except Exception:  # e.g. a field with no canonical form: not a valid signature either
        return False
    return True
