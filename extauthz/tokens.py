"""Bearer extraction and strict JWS/JWT verification (pure, no I/O, no clock).

PyJWT's ``decode`` is not used for claims on purpose: it accepts
``exp: "1900000000"`` (a string), lets ``TypeError``/``OverflowError`` escape
for ``exp: [1]`` and ``exp: 1e400``, and would pick the algorithm machinery
from the token header. Here the compact form is parsed strictly, the
algorithm must be on the policy's allow-list, the key is chosen by family
(see ``keys``), the signature is checked *before* the payload JSON is even
parsed, and ``nbf``/``exp`` must be finite JSON numbers. Every failure is a
``Denied`` with a fixed reason.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from extauthz.keys import KeySet, b64url_decode, verify_signature
from extauthz.reasons import Denied, Reason

MAX_TOKEN_BYTES = 8 * 1024
"""Tokens longer than this are denied before any parsing (Envoy's default
header limit is 60 KiB; real JWTs are well under 2 KiB)."""

MAX_KIDLESS_CANDIDATES = 8
"""A token without ``kid`` is tried against at most this many compatible keys;
beyond that the token must name its key (bounds CPU per forged token)."""

_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9!#$%&'*+.^_`|~-]*) +(.*)")
_COMPACT_JWS = re.compile(r"[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+")


@dataclass(frozen=True, slots=True)
class JwtRules:
    """The policy knobs that decide whether a token is acceptable."""

    algorithms: frozenset[str]
    leeway_seconds: float = 0.0
    issuer: str | None = None
    audiences: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class VerifiedToken:
    """A token whose signature and static claims passed; time is checked per use."""

    nbf: float
    exp: float
    claims: Mapping[str, Any]


def extract_bearer(values: Sequence[str]) -> str:
    """The token from the ``Authorization`` value(s), or ``Denied``.

    One value only: several raw values, or a value Envoy merged with ``,``,
    are denied (a JWT never contains a comma). The scheme is matched
    case-insensitively and may be followed by one or more spaces (RFC 7235
    ``1*SP``); surrounding optional whitespace is ignored.
    """
    if not values:
        raise Denied(Reason.MISSING_AUTHORIZATION)
    if len(values) > 1:
        raise Denied(Reason.MULTIPLE_AUTHORIZATION)
    value = values[0]
    if len(value) > MAX_TOKEN_BYTES + 64:
        raise Denied(Reason.TOKEN_TOO_LARGE)
    if "," in value:
        raise Denied(Reason.MULTIPLE_AUTHORIZATION)
    value = value.strip(" \t")
    if not value:
        raise Denied(Reason.MISSING_AUTHORIZATION)
    match = _SCHEME.fullmatch(value)
    if match is None or match.group(1).lower() != "bearer":
        raise Denied(Reason.NOT_BEARER)
    token = match.group(2)
    if len(token) > MAX_TOKEN_BYTES:
        raise Denied(Reason.TOKEN_TOO_LARGE)
    if not _COMPACT_JWS.fullmatch(token):
        raise Denied(Reason.MALFORMED_TOKEN)
    return token


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-finite JSON constant {name}")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise ValueError("duplicate member name")  # parsers disagree on which wins
    return obj


def _json_object(segment: str) -> dict[str, Any]:
    try:
        # RFC 7519 JSON is UTF-8; json.loads(bytes) would also take UTF-16/32.
        obj = json.loads(
            b64url_decode(segment).decode("utf-8"),
            parse_constant=_reject_constant,
            object_pairs_hook=_unique_keys,
        )
    except (ValueError, RecursionError, UnicodeDecodeError):
        raise Denied(Reason.MALFORMED_TOKEN) from None
    if not isinstance(obj, dict):
        raise Denied(Reason.MALFORMED_TOKEN)
    return obj


def _time_claim(claims: Mapping[str, Any], name: str) -> float:
    value = claims.get(name)
    if not (type(value) is int or type(value) is float):  # not bool, str, list, None
        raise Denied(Reason.BAD_TIME_CLAIM)
    try:
        number = float(value)
    except OverflowError:  # an int beyond float range (1e400 written out)
        raise Denied(Reason.BAD_TIME_CLAIM) from None
    if not math.isfinite(number):
        raise Denied(Reason.BAD_TIME_CLAIM)
    return number


def verify_token(token: str, rules: JwtRules, keys: KeySet) -> VerifiedToken:
    """Verify a compact JWS and its static claims; raise ``Denied`` otherwise."""
    parts = token.split(".")
    if len(parts) != 3:
        raise Denied(Reason.MALFORMED_TOKEN)
    header_b64, payload_b64, signature_b64 = parts
    header = _json_object(header_b64)
    alg = header.get("alg")
    if not isinstance(alg, str) or alg not in rules.algorithms:
        raise Denied(Reason.ALGORITHM_NOT_ALLOWED)
    if "crit" in header or "b64" in header:
        raise Denied(Reason.UNSUPPORTED_HEADER)  # extensions we do not implement
    kid = header.get("kid")
    if kid is not None and not isinstance(kid, str):
        raise Denied(Reason.MALFORMED_TOKEN)
    try:
        signature = b64url_decode(signature_b64)
    except ValueError:
        raise Denied(Reason.MALFORMED_TOKEN) from None
    if not keys.keys:
        raise Denied(Reason.NO_KEYS)
    if kid is not None:
        group = keys.by_kid.get(kid)
        if group is None:
            raise Denied(Reason.UNKNOWN_KID)
        candidates = [key for key in group if key.usable_for(alg)]
    else:
        candidates = [key for key in keys.keys if key.usable_for(alg)]
        if len(candidates) > MAX_KIDLESS_CANDIDATES:
            raise Denied(Reason.KID_REQUIRED)
    if not candidates:
        raise Denied(Reason.KEY_MISMATCH)
    signing_input = token[: len(header_b64) + 1 + len(payload_b64)].encode("ascii")
    if not any(verify_signature(alg, key, signing_input, signature) for key in candidates):
        raise Denied(Reason.BAD_SIGNATURE)
    claims = _json_object(payload_b64)
    nbf = _time_claim(claims, "nbf")
    exp = _time_claim(claims, "exp")
    if rules.issuer is not None and claims.get("iss") != rules.issuer:
        raise Denied(Reason.ISSUER_MISMATCH)
    if rules.audiences:
        aud = claims.get("aud")
        values = [aud] if isinstance(aud, str) else aud if isinstance(aud, list) else []
        if not any(isinstance(v, str) and v in rules.audiences for v in values):
            raise Denied(Reason.AUDIENCE_MISMATCH)
    return VerifiedToken(nbf=nbf, exp=exp, claims=claims)


def check_time(nbf: float, exp: float, now: float, leeway: float) -> None:
    """``nbf <= now < exp``, each widened by ``leeway``; ``Denied`` otherwise."""
    if now + leeway < nbf:
        raise Denied(Reason.NOT_YET_VALID)
    if now - leeway >= exp:
        raise Denied(Reason.EXPIRED)
