"""Checks on the claims of a verified JWT, with the clock passed in.

Signature verification is done by ``jwks``/PyJWT; the time and identity
checks live here, as pure functions, so every edge (leeway, skew, a
missing ``nonce``) is table-tested without a provider or a sleeping test.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mgmt_api.identity.errors import InvalidTokenError

DEFAULT_LEEWAY_S = 60.0
# An ID token issued further in the future than this is refused: it means the
# provider's clock (or the token) is wrong by more than any sane skew.
MAX_FUTURE_IAT_S = 300.0


def _number(claims: Mapping[str, Any], name: str) -> float:
    value = claims.get(name)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidTokenError(
            f"the token has no numeric '{name}' claim", reason=f"missing_{name}"
        )
    return float(value)


def _string(claims: Mapping[str, Any], name: str) -> str:
    value = claims.get(name)
    if not isinstance(value, str) or not value:
        raise InvalidTokenError(f"the token has no '{name}' claim", reason=f"missing_{name}")
    return value


def audiences(claims: Mapping[str, Any]) -> list[str]:
    aud = claims.get("aud")
    if isinstance(aud, str):
        return [aud]
    if isinstance(aud, list) and all(isinstance(a, str) for a in aud):
        return list(aud)
    return []


def check_time(claims: Mapping[str, Any], *, now: float, leeway: float = DEFAULT_LEEWAY_S) -> None:
    """``exp`` is required and in the future, ``iat`` not in the future, ``nbf`` passed."""
    exp = _number(claims, "exp")
    if now - leeway >= exp:
        raise InvalidTokenError("the token has expired", reason="expired")
    if "iat" in claims:
        iat = _number(claims, "iat")
        if iat > now + leeway:
            raise InvalidTokenError("the token was issued in the future", reason="iat_in_future")
    if "nbf" in claims:
        nbf = _number(claims, "nbf")
        if nbf > now + leeway:
            raise InvalidTokenError("the token is not valid yet", reason="not_yet_valid")


def check_id_token(
    claims: Mapping[str, Any],
    *,
    issuer: str,
    client_id: str,
    nonce: str | None,
    now: float,
    leeway: float = DEFAULT_LEEWAY_S,
) -> str:
    """OIDC Core 3.1.3.7 checks on a signature-verified ID token; returns ``sub``.

    ``nonce`` is the value we sent (``None`` for flows without one, such as
    the device flow); when we sent one, the token must echo it exactly,
    which is what stops a token issued for another login being replayed.
    """
    if claims.get("iss") != issuer:
        raise InvalidTokenError("the ID token was issued by another issuer", reason="wrong_issuer")
    auds = audiences(claims)
    if client_id not in auds:
        raise InvalidTokenError(
            "the ID token is not meant for this client", reason="wrong_audience"
        )
    if len(auds) > 1 and claims.get("azp") != client_id:
        raise InvalidTokenError(
            "the ID token has several audiences and another authorized party", reason="wrong_azp"
        )
    check_time(claims, now=now, leeway=leeway)
    _number(claims, "iat")
    if nonce is not None and claims.get("nonce") != nonce:
        raise InvalidTokenError(
            "the ID token's nonce does not match the login", reason="wrong_nonce"
        )
    return _string(claims, "sub")
