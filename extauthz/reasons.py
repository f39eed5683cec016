"""The closed set of decision reasons, and the Decision value itself.

Reasons are a fixed enum rather than free text for three reasons: they are a
Prometheus label (bounded cardinality), they are the machine-readable code in
the deny body and ``x-ext-authz-reason`` header that operators grep for, and a
closed set makes it impossible to leak token material into a response by
formatting an exception message into it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Reason(enum.StrEnum):
    """Why a request was allowed or denied. The value is the wire code."""

    # Allows.
    OK = "ok"
    ALLOW_POLICY = "allow_policy"
    # Policy selection.
    DENY_POLICY = "deny_policy"
    UNKNOWN_POLICY = "unknown_policy"
    # Authorization header.
    MISSING_AUTHORIZATION = "missing_authorization"
    MULTIPLE_AUTHORIZATION = "multiple_authorization"
    NOT_BEARER = "not_bearer"
    TOKEN_TOO_LARGE = "token_too_large"  # noqa: S105 - a reason code, not a secret
    MALFORMED_TOKEN = "malformed_token"  # noqa: S105 - a reason code, not a secret
    # Signature.
    ALGORITHM_NOT_ALLOWED = "algorithm_not_allowed"
    UNSUPPORTED_HEADER = "unsupported_header"
    NO_KEYS = "no_keys"
    UNKNOWN_KID = "unknown_kid"
    KID_REQUIRED = "kid_required"
    KEY_MISMATCH = "key_mismatch"
    BAD_SIGNATURE = "bad_signature"
    # Claims.
    BAD_TIME_CLAIM = "bad_time_claim"
    NOT_YET_VALID = "not_yet_valid"
    EXPIRED = "expired"
    ISSUER_MISMATCH = "issuer_mismatch"
    AUDIENCE_MISMATCH = "audience_mismatch"
    BAD_PATH_CLAIM = "bad_path_claim"
    # Request path.
    MISSING_PATH = "missing_path"
    BAD_PATH = "bad_path"
    PATH_NOT_ALLOWED = "path_not_allowed"
    # Anything unexpected inside the server. Always a deny.
    INTERNAL_ERROR = "internal_error"


_RULE_OF_GROUP: tuple[tuple[str, tuple[Reason, ...]], ...] = (
    ("policy", (Reason.DENY_POLICY, Reason.UNKNOWN_POLICY)),
    (
        "authorization",
        (
            Reason.MISSING_AUTHORIZATION,
            Reason.MULTIPLE_AUTHORIZATION,
            Reason.NOT_BEARER,
            Reason.TOKEN_TOO_LARGE,
            Reason.MALFORMED_TOKEN,
        ),
    ),
    ("jwt.algorithms", (Reason.ALGORITHM_NOT_ALLOWED, Reason.UNSUPPORTED_HEADER)),
    (
        "jwt.keys",
        (
            Reason.NO_KEYS,
            Reason.UNKNOWN_KID,
            Reason.KID_REQUIRED,
            Reason.KEY_MISMATCH,
            Reason.BAD_SIGNATURE,
        ),
    ),
    ("jwt.leewaySeconds", (Reason.BAD_TIME_CLAIM, Reason.NOT_YET_VALID, Reason.EXPIRED)),
    ("jwt.issuer", (Reason.ISSUER_MISMATCH,)),
    ("jwt.audiences", (Reason.AUDIENCE_MISMATCH,)),
    (
        "pathClaim",
        (Reason.BAD_PATH_CLAIM, Reason.MISSING_PATH, Reason.BAD_PATH, Reason.PATH_NOT_ALLOWED),
    ),
    ("internal", (Reason.INTERNAL_ERROR,)),
    ("allow", (Reason.OK, Reason.ALLOW_POLICY)),
)

#: The part of an ExtAuthzPolicy a reason comes from (a decision line's ``rule``):
#: its field (``jwt.keys``, ``pathClaim``), or the request's ``authorization``
#: header, the ``policy`` choice itself, ``internal`` or ``allow``.
RULES: dict[Reason, str] = {reason: rule for rule, reasons in _RULE_OF_GROUP for reason in reasons}
assert set(RULES) == set(Reason), "every reason names its rule"


class Denied(Exception):
    """Raised inside the pure logic to stop at the first failed rule.

    It carries only a ``Reason``: the message is never user-controlled text,
    so nothing from the request can end up in a log line or a response body
    through it.
    """

    def __init__(self, reason: Reason) -> None:
        super().__init__(reason.value)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Decision:
    """The outcome of one check, independent of the wire protocol.

    ``headers_to_add`` are request headers for the upstream (claims copied
    into headers); ``headers_to_remove`` are request headers the proxy must
    strip before forwarding (``authorization``, and claim headers whose claim
    is absent so that a client cannot smuggle its own value through).
    ``claims_metadata`` are the verified claims published as Envoy dynamic
    metadata (``extauthz.claim_metadata``); only an allow carries any.
    """

    allowed: bool
    reason: Reason
    policy: str = ""
    headers_to_add: tuple[tuple[str, str], ...] = ()
    headers_to_remove: tuple[str, ...] = ()
    claims_metadata: tuple[tuple[str, str], ...] = ()


def deny(reason: Reason, policy: str = "") -> Decision:
    """A deny decision; the only constructor deny paths use."""
    return Decision(allowed=False, reason=reason, policy=policy)
