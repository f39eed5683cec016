"""Verification key material: parsing, immutable key sets, signature checks.

Every key is bound to one *family* (HMAC, RSA, EC, OKP) when it is loaded,
and a token's ``alg`` may only be verified with a key of the matching family
(and, for EC, the matching curve). That binding is what makes HS/RS confusion
impossible: an ``HS256`` token is never checked against bytes that came from
a public key, whatever the token header says. ``none`` is not in the table,
so it can never verify.

This module is pure (bytes and dicts in, immutable values out). Fetching
JWKS over HTTP lives in ``jwks_remote``; the per-policy view that merges
static and fetched keys lives in ``keyring``.
"""

from __future__ import annotations

import base64
import binascii
import enum
import hashlib
import hmac
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    PublicFormat,
    load_pem_public_key,
)
from jwt.algorithms import get_default_algorithms


class KeyError_(ValueError):  # trailing _ avoids the builtin KeyError
    """Key material that cannot be used; the message names the problem, not the key."""


class KeyFamily(enum.StrEnum):
    HMAC = "HMAC"
    RSA = "RSA"
    EC = "EC"
    OKP = "OKP"


ALGORITHM_FAMILY: Mapping[str, KeyFamily] = {
    "HS256": KeyFamily.HMAC,
    "HS384": KeyFamily.HMAC,
    "HS512": KeyFamily.HMAC,
    "RS256": KeyFamily.RSA,
    "RS384": KeyFamily.RSA,
    "RS512": KeyFamily.RSA,
    "PS256": KeyFamily.RSA,
    "PS384": KeyFamily.RSA,
    "PS512": KeyFamily.RSA,
    "ES256": KeyFamily.EC,
    "ES384": KeyFamily.EC,
    "ES512": KeyFamily.EC,
    "EdDSA": KeyFamily.OKP,
}
SUPPORTED_ALGORITHMS = frozenset(ALGORITHM_FAMILY)

# ECDSA algorithms are tied to one curve each (RFC 7518 §3.4).
_EC_CURVE: Mapping[str, str] = {"ES256": "secp256r1", "ES384": "secp384r1", "ES512": "secp521r1"}
_JWK_CURVE: Mapping[str, str] = {"P-256": "secp256r1", "P-384": "secp384r1", "P-521": "secp521r1"}
_HMAC_HASH: Mapping[str, str] = {"HS256": "sha256", "HS384": "sha384", "HS512": "sha512"}
MIN_RSA_BITS = 2048
_ASYMMETRIC = get_default_algorithms()


@dataclass(frozen=True, slots=True)
class VerifyKey:
    """One usable verification key.

    ``material`` is the HMAC secret (bytes) or a cryptography public key.
    ``alg`` is set when the JWK pinned an algorithm; ``curve`` for EC keys.
    """

    family: KeyFamily
    material: Any = field(repr=False)
    kid: str | None = None
    alg: str | None = None
    curve: str | None = None

    def usable_for(self, alg: str) -> bool:
        """Whether a token signed with ``alg`` may be checked with this key."""
        if ALGORITHM_FAMILY.get(alg) is not self.family:
            return False
        if self.alg is not None and self.alg != alg:
            return False
        return self.family is not KeyFamily.EC or _EC_CURVE.get(alg) == self.curve

    def fingerprint(self) -> str:
        """A short, non-reversible identity for logs (never the key itself)."""
        if self.family is KeyFamily.HMAC:
            raw = bytes(self.material)
        else:
            raw = self.material.public_bytes(Encoding.DER, PublicFormat.SubjectPublicKeyInfo)
        return hashlib.sha256(raw).hexdigest()[:12]


@dataclass(frozen=True)
class KeySet:
    """An immutable set of keys with a kid index, built once per change."""

    keys: tuple[VerifyKey, ...] = ()
    by_kid: Mapping[str, tuple[VerifyKey, ...]] = field(default_factory=dict)

    @classmethod
    def of(cls, keys: tuple[VerifyKey, ...] | list[VerifyKey]) -> KeySet:
        index: dict[str, list[VerifyKey]] = {}
        for key in keys:
            if key.kid is not None:
                index.setdefault(key.kid, []).append(key)
        return cls(tuple(keys), {kid: tuple(group) for kid, group in index.items()})

    def merged(self, other: KeySet) -> KeySet:
        return KeySet.of(self.keys + other.keys)


def verify_signature(alg: str, key: VerifyKey, signing_input: bytes, signature: bytes) -> bool:
    """Check one JWS signature; False for any mismatch, never raises on bad input."""
    if not key.usable_for(alg):
        return False
    if key.family is KeyFamily.HMAC:
        digest = hmac.new(key.material, signing_input, _HMAC_HASH[alg]).digest()
        return hmac.compare_digest(digest, signature)
    try:
        return bool(_ASYMMETRIC[alg].verify(signing_input, key.material, signature))
    except (ValueError, TypeError):
        return False


def b64url_decode(segment: str) -> bytes:
    """Strict base64url without padding (JWS compact form)."""
    if len(segment) % 4 == 1:
        raise ValueError("bad base64url length")
    try:
        return base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4))
    except (binascii.Error, ValueError) as exc:
        raise ValueError("bad base64url") from exc


def hmac_key(secret: bytes, *, kid: str | None = None) -> VerifyKey:
    """An HMAC secret. PEM/JWK-looking secrets are refused (confusion guard)."""
    if not secret:
        raise KeyError_("HMAC secret is empty")
    try:
        _ASYMMETRIC["HS256"].prepare_key(secret)
    except Exception as exc:
        raise KeyError_("HMAC secret looks like an asymmetric key or a JWK") from exc
    return VerifyKey(KeyFamily.HMAC, bytes(secret), kid=kid)


def _public_key(obj: Any, *, kid: str | None, alg: str | None) -> VerifyKey:
    if isinstance(obj, rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey):
        obj = obj.public_key()
    if isinstance(obj, ed25519.Ed25519PrivateKey | ed448.Ed448PrivateKey):
        obj = obj.public_key()
    if isinstance(obj, rsa.RSAPublicKey):
        if obj.key_size < MIN_RSA_BITS:
            raise KeyError_(f"RSA key has {obj.key_size} bits; at least {MIN_RSA_BITS} required")
        return VerifyKey(KeyFamily.RSA, obj, kid=kid, alg=alg)
    if isinstance(obj, ec.EllipticCurvePublicKey):
        if obj.curve.name not in _EC_CURVE.values():
            raise KeyError_(f"unsupported EC curve {obj.curve.name}")
        return VerifyKey(KeyFamily.EC, obj, kid=kid, alg=alg, curve=obj.curve.name)
    if isinstance(obj, ed25519.Ed25519PublicKey | ed448.Ed448PublicKey):
        return VerifyKey(KeyFamily.OKP, obj, kid=kid, alg=alg)
    raise KeyError_(f"unsupported public key type {type(obj).__name__}")


def pem_public_key(pem: bytes, *, kid: str | None = None) -> VerifyKey:
    """A PEM ``PUBLIC KEY`` (RSA >= 2048 bits, EC P-256/384/521, Ed25519/Ed448)."""
    try:
        obj = load_pem_public_key(pem)
    except (ValueError, TypeError) as exc:
        raise KeyError_("not a PEM public key") from exc
    return _public_key(obj, kid=kid, alg=None)


def jwk_key(jwk: Mapping[str, Any]) -> VerifyKey:
    """One JWK (RFC 7517) as a verification key, or KeyError_ if unusable."""
    kty = jwk.get("kty")
    kid = jwk.get("kid")
    alg = jwk.get("alg")
    if kid is not None and not isinstance(kid, str):
        raise KeyError_("kid is not a string")
    if alg is not None and alg not in SUPPORTED_ALGORITHMS:
        raise KeyError_(f"unsupported alg {alg!r}")
    if jwk.get("use", "sig") != "sig":
        raise KeyError_("use is not 'sig'")
    ops = jwk.get("key_ops")
    if ops is not None and (not isinstance(ops, list) or "verify" not in ops):
        raise KeyError_("key_ops does not include 'verify'")
    if kty == "oct":
        k = jwk.get("k")
        if not isinstance(k, str):
            raise KeyError_("oct key without k")
        try:
            secret = b64url_decode(k)
        except ValueError as exc:
            raise KeyError_("oct key k is not base64url") from exc
        key = hmac_key(secret, kid=kid)
        if alg is not None and ALGORITHM_FAMILY[alg] is not KeyFamily.HMAC:
            raise KeyError_("oct key with a non-HMAC alg")
        return VerifyKey(KeyFamily.HMAC, key.material, kid=kid, alg=alg)
    loaders = {"RSA": "RS256", "EC": "ES256", "OKP": "EdDSA"}
    if kty not in loaders:
        raise KeyError_(f"unsupported kty {kty!r}")
    if kty == "EC" and jwk.get("crv") not in _JWK_CURVE:
        raise KeyError_(f"unsupported EC curve {jwk.get('crv')!r}")
    try:
        obj = _ASYMMETRIC[loaders[kty]].from_jwk(dict(jwk))
    except Exception as exc:
        raise KeyError_(f"invalid {kty} key") from exc
    key = _public_key(obj, kid=kid, alg=alg)
    if alg is not None and ALGORITHM_FAMILY[alg] is not key.family:
        raise KeyError_(f"{kty} key with alg {alg}")
    return key


@dataclass(frozen=True)
class ParsedJwks:
    keys: KeySet
    skipped: tuple[str, ...]  # why each unusable key was skipped, for logs


def parse_jwks(document: bytes | str | Mapping[str, Any]) -> ParsedJwks:
    """Parse a JWKS document. Unusable keys are skipped (and reported), but a
    document that is not ``{"keys": [...]}`` or has no usable key at all
    raises KeyError_, so a broken fetch never replaces a good key set with
    an empty one."""
    if isinstance(document, bytes | str):
        try:
            document = json.loads(document)
        except ValueError as exc:
            raise KeyError_("JWKS is not valid JSON") from exc
    if not isinstance(document, Mapping) or not isinstance(document.get("keys"), list):
        raise KeyError_('JWKS must be an object with a "keys" list')
    keys: list[VerifyKey] = []
    skipped: list[str] = []
    for index, entry in enumerate(document["keys"]):
        if not isinstance(entry, Mapping):
            skipped.append(f"keys[{index}]: not an object")
            continue
        try:
            keys.append(jwk_key(entry))
        except KeyError_ as exc:
            skipped.append(f"keys[{index}]: {exc}")
    if not keys:
        # An empty set would turn a glitch at the IdP into a total outage;
        # treat it as a failed fetch so the last good keys keep serving.
        raise KeyError_("JWKS has no usable key: " + ("; ".join(skipped[:5]) or "empty"))
    return ParsedJwks(KeySet.of(keys), tuple(skipped))
