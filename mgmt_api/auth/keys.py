"""Service-account key pairs: ES256 (P-256) keys, exported as PEM or JWK.

P-256 keys are fast to generate (an RSA-2048 key costs tens of ms) and small
enough for an install template. The private key leaves the server exactly
once, in the response that created it; only the public JWK is stored.
"""

from __future__ import annotations

import base64
import json
import secrets
from dataclasses import dataclass
from typing import TypedDict

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from jwt.algorithms import ECAlgorithm

ALGORITHM = "ES256"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


class PublicJwk(TypedDict):
    """A P-256 public key as a JWK (RFC 7518 6.2.1), the form stored and served in a JWKS."""

    kty: str
    crv: str
    x: str
    y: str
    kid: str
    alg: str
    use: str


class PrivateJwk(PublicJwk):
    """The same key with its private value ``d``: leaves the server once, never stored."""

    d: str


@dataclass(frozen=True, slots=True)
class KeyPair:
    id: str
    public_jwk: PublicJwk
    private_jwk: PrivateJwk
    public_pem: str
    private_pem: str


def generate() -> KeyPair:
    key = ec.generate_private_key(ec.SECP256R1())
    numbers = key.private_numbers()
    pub = numbers.public_numbers
    kid = secrets.token_hex(12)
    public_jwk: PublicJwk = {
        "kty": "EC",
        "crv": "P-256",
        "x": _b64(pub.x.to_bytes(32, "big")),
        "y": _b64(pub.y.to_bytes(32, "big")),
        "kid": kid,
        "alg": ALGORITHM,
        "use": "sig",
    }
    private_jwk: PrivateJwk = {**public_jwk, "d": _b64(numbers.private_value.to_bytes(32, "big"))}
    private_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    public_pem = (
        key.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )
    return KeyPair(kid, public_jwk, private_jwk, public_pem, private_pem)


def public_pem_of(public_jwk: PublicJwk) -> str:
    key = ECAlgorithm.from_jwk(json.dumps(public_jwk))
    assert isinstance(key, ec.EllipticCurvePublicKey)
    return key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    ).decode()


def encode_jwk(jwk: PrivateJwk) -> str:
    """The ``encodedJwk`` form of an install template: base64 of the JWK JSON."""
    return base64.b64encode(json.dumps(jwk, separators=(",", ":")).encode()).decode()
