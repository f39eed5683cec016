"""Test helpers: keys, and tokens built byte by byte (including malformed ones).

Tokens are assembled here rather than with ``jwt.encode`` so tests can produce
exactly the bad inputs the server must refuse: string ``exp``, ``1e400``,
duplicate members, ``alg: none``, HS256 signed with a public key, etc.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import json
from typing import Any

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from jwt.algorithms import ECAlgorithm, RSAAlgorithm

HS_SECRET = b"test-secret-0123456789abcdef-0123"
OTHER_SECRET = b"another-secret-0123456789abcdef-x"


def b64u(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def b64path(path: str, *, urlsafe: bool = False, pad: bool = True) -> str:
    raw = (base64.urlsafe_b64encode if urlsafe else base64.b64encode)(path.encode()).decode()
    return raw if pad else raw.rstrip("=")


@functools.cache
def rsa_key(index: int = 0) -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@functools.cache
def ec_key(index: int = 0, curve: str = "P-256") -> ec.EllipticCurvePrivateKey:
    curves = {"P-256": ec.SECP256R1(), "P-384": ec.SECP384R1()}
    return ec.generate_private_key(curves[curve])


def public_pem(key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey) -> bytes:
    return key.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)


def public_jwk(
    key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey, kid: str, alg: str | None = None
) -> dict[str, Any]:
    if isinstance(key, rsa.RSAPrivateKey):
        jwk = json.loads(RSAAlgorithm.to_jwk(key.public_key()))
    else:
        jwk = json.loads(ECAlgorithm.to_jwk(key.public_key()))
    jwk["kid"] = kid
    jwk["use"] = "sig"
    if alg:
        jwk["alg"] = alg
    return dict(jwk)


def segment(obj: Any) -> str:
    if isinstance(obj, bytes):
        return b64u(obj)
    if isinstance(obj, str):
        return b64u(obj.encode())
    return b64u(json.dumps(obj, separators=(",", ":")).encode())


def sign(alg: str, signing_input: bytes, key: Any) -> bytes:
    if alg.startswith("HS"):
        digest = {"HS256": "sha256", "HS384": "sha384", "HS512": "sha512"}[alg]
        return hmac.new(key, signing_input, digest).digest()
    hash_alg = {"256": hashes.SHA256(), "384": hashes.SHA384(), "512": hashes.SHA512()}[alg[2:]]
    if alg.startswith("RS"):
        return bytes(key.sign(signing_input, padding.PKCS1v15(), hash_alg))
    if alg.startswith("ES"):
        r, s = decode_dss_signature(key.sign(signing_input, ec.ECDSA(hash_alg)))
        size = (key.curve.key_size + 7) // 8
        return r.to_bytes(size, "big") + s.to_bytes(size, "big")
    raise ValueError(alg)


def make_token(
    payload: Any,
    *,
    alg: str = "HS256",
    key: Any = HS_SECRET,
    header: dict[str, Any] | None = None,
    raw_header: str | None = None,
    raw_payload: str | None = None,
) -> str:
    """A compact JWS; ``raw_*`` give the exact JSON text of a segment."""
    head = (
        segment(raw_header) if raw_header is not None else segment({"alg": alg, **(header or {})})
    )
    body = segment(raw_payload) if raw_payload is not None else segment(payload)
    signing_input = f"{head}.{body}".encode()
    return f"{head}.{body}.{b64u(sign(alg, signing_input, key))}"


def claims(now: float, path: str | None = "/headers", **extra: Any) -> dict[str, Any]:
    """Valid claims around ``now`` (nbf an hour ago, exp in an hour)."""
    out: dict[str, Any] = {"nbf": int(now) - 3600, "exp": int(now) + 3600}
    if path is not None:
        out["path"] = b64path(path)
    out.update(extra)
    return {k: v for k, v in out.items() if v is not ...}


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()[:8]
