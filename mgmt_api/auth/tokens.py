"""Bearer tokens: management-plane session tokens and service-account JWTs.

* Session tokens (``POST /v2/auth/token``) are HS256 JWTs signed with a
  secret generated at first start and kept in the store, so every replica of
  the management plane accepts them. Header ``kid`` is ``SESSION_KID``.
* Service-account JWTs are signed by the account's private key (ES256); the
  header ``kid`` names the key, which selects the stored public key. A token
  must carry ``iat`` and ``exp`` and its lifetime (``exp - iat``) may not
  exceed the account's ``tokenTtl`` (the cluster's, for a cluster agent).
* Audiences keep the uses of a cluster account's key apart (which account
  may open which stream is ``mgmt_api.domain.cluster_accounts``). A token for
  the policy-distribution stream carries ``aud`` = :data:`DISTRIBUTION_AUDIENCE`
  and is refused by REST; REST tokens carry no such audience and are refused
  by the stream. A token seen on one channel (a stream token is sent on
  every connect) can therefore not be replayed on the other.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
from dataclasses import dataclass
from typing import Any

import jwt

from agent.contract import TUNNEL_AUDIENCE
from meshplane.distribution_contract import TOKEN_AUDIENCE
from meshplane.gateway_contract import XDS_AUDIENCE
from mgmt_api.auth.keys import PrivateJwk, PublicJwk

SESSION_KID = "meshplane-session"
ISSUER = "meshplane"
LEEWAY_SECONDS = 5.0
SESSION_TTL_SECONDS = 3600
# ``aud`` of the tokens that open a PolicyDistribution stream, and only those.
DISTRIBUTION_AUDIENCE = TOKEN_AUDIENCE
# ``aud`` of the tokens gateway Envoys open their ADS stream with (long-lived: Envoy
# cannot mint them; meshplane.gateway_contract).
GATEWAY_AUDIENCE = XDS_AUDIENCE
# The audiences of stream tokens (policy stream, agent tunnel, gateway ADS): REST
# refuses them all. A gateway's lives 30 days in a bootstrap file, so REST must not
# take it even where a cluster's tokenTtl would allow that lifetime.
STREAM_AUDIENCES = frozenset({DISTRIBUTION_AUDIENCE, TUNNEL_AUDIENCE, GATEWAY_AUDIENCE})


def new_signing_secret() -> str:
    return secrets.token_urlsafe(48)


def credential_stamp(secret: str, password_hash: str | None) -> str:
    """What a session token records of its user's password: a keyed digest of the hash.

    A session is valid only while the user's stored password hash is the one
    it was issued under, so any password change or reset (a new salt, hence a
    new hash, even for the same password) ends every session of that user on
    every replica, with no revocation list. The digest is keyed by the
    signing secret and says nothing about the password; a user without a
    password (OIDC) has a stamp too, which changes if one is set.
    """
    key = hmac.new(secret.encode(), b"meshplane-session-credential", hashlib.sha256).digest()
    digest = hmac.new(key, (password_hash or "").encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest[:12]).decode()


def mint_session(
    secret: str, subject: str, now: float, stamp: str, ttl: int = SESSION_TTL_SECONDS
) -> str:
    """A session token; ``stamp`` is :func:`credential_stamp` of the subject's password."""
    claims = {
        "iss": ISSUER,
        "sub": subject,
        "iat": int(now),
        "exp": int(now) + ttl,
        "jti": secrets.token_hex(8),
        "cred": stamp,
    }
    return jwt.encode(claims, secret, algorithm="HS256", headers={"kid": SESSION_KID})


@dataclass(frozen=True, slots=True)
class SessionClaims:
    subject: str
    #: :func:`credential_stamp` at issue; "" for a token minted before stamps existed.
    stamp: str


class TokenError(Exception):
    """The token is malformed, expired, or not signed by a key we trust."""


def header_kid(token: str) -> str:
    try:
        header = jwt.get_unverified_header(token)
    except jwt.PyJWTError as exc:
        raise TokenError("malformed token") from exc
    kid = header.get("kid")
    if not isinstance(kid, str) or not kid:
        raise TokenError("token has no kid")
    return kid


def verify_session(secret: str, token: str, now: float) -> SessionClaims:
    try:
        claims = jwt.decode(
            token,
            secret,
            algorithms=["HS256"],
            issuer=ISSUER,
            options={"require": ["exp", "iat", "sub"], "verify_exp": False},
        )
    except jwt.PyJWTError as exc:
        raise TokenError(f"invalid session token: {exc}") from exc
    if float(claims["exp"]) + LEEWAY_SECONDS < now:
        raise TokenError("session token expired")
    stamp = claims.get("cred")
    return SessionClaims(str(claims["sub"]), stamp if isinstance(stamp, str) else "")


def jwt_exp(token: str) -> float:
    """``exp`` of a token whose signature was already verified."""
    claims = jwt.decode(token, options={"verify_signature": False})
    return float(claims["exp"])


@dataclass(frozen=True, slots=True)
class ServiceAccountClaims:
    subject: str | None
    issued_at: float
    expires_at: float


def _audiences(claims: dict[str, Any]) -> list[str]:
    aud = claims.get("aud")
    if aud is None:
        return []
    if isinstance(aud, str):
        return [aud]
    if isinstance(aud, list) and all(isinstance(a, str) for a in aud):
        return list(aud)
    raise TokenError("invalid service-account token: aud must be a string or a list of strings")


def verify_service_account(
    public_jwk: PublicJwk,
    token: str,
    now: float,
    max_ttl: float,
    *,
    audience: str | None = None,
) -> ServiceAccountClaims:
    """Verify an ES256 service-account token signed with ``public_jwk``'s key.

    ``audience=None`` is REST: a token made for the distribution stream
    (``aud`` holding :data:`DISTRIBUTION_AUDIENCE`) is refused, anything else
    is accepted as before. ``audience=X`` requires ``aud`` to hold X, so
    a REST token cannot open a stream either.
    """
    try:
        key = jwt.PyJWK.from_json(json.dumps(public_jwk))
        claims = jwt.decode(
            token,
            key,
            algorithms=["ES256"],
            options={
                "require": ["exp", "iat"],
                "verify_exp": False,
                "verify_iat": False,
                "verify_aud": False,
            },
        )
    except jwt.PyJWTError as exc:
        raise TokenError(f"invalid service-account token: {exc}") from exc
    audiences = _audiences(claims)
    if audience is None and STREAM_AUDIENCES.intersection(audiences):
        raise TokenError(
            "a stream token (policy distribution, agent tunnel, gateway ADS) is not accepted here"
        )
    if audience is not None and audience not in audiences:
        raise TokenError(f"the token's audience is not {audience}")
    iat, exp = float(claims["iat"]), float(claims["exp"])
    if exp + LEEWAY_SECONDS < now:
        raise TokenError("service-account token expired")
    if iat - LEEWAY_SECONDS > now:
        raise TokenError("service-account token issued in the future")
    if exp - iat > max_ttl + LEEWAY_SECONDS:
        raise TokenError(f"service-account token lifetime exceeds tokenTtl ({int(max_ttl)}s)")
    sub = claims.get("sub")
    return ServiceAccountClaims(str(sub) if sub is not None else None, iat, exp)


def sign_service_account(private_jwk: PrivateJwk, subject: str, now: float, ttl: float) -> str:
    """What an agent does with its API key; used by tests, benches and meshctl."""
    key = jwt.PyJWK.from_json(json.dumps(private_jwk))
    claims = {"sub": subject, "iat": int(now), "exp": int(now + ttl)}
    return jwt.encode(claims, key.key, algorithm="ES256", headers={"kid": private_jwk["kid"]})
