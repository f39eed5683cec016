"""Wire renderings of a Decision shared by both adapters.

The deny body is short, fixed JSON naming only the reason code, e.g.
``{"error":"forbidden","reason":"expired"}``; the same code goes into the
``x-ext-authz-reason`` header, and into the ``x-meshplane-denied`` header
every proxy denial carries (``extauthz expired``,
:func:`meshplane.decision_log.denied_value`). Nothing from the request (and
never the token) is echoed.
"""

from __future__ import annotations

import json

from extauthz.reasons import Reason
from meshplane.decision_log import DENIED_HEADER, DenialKind, denied_value

REASON_HEADER = "x-ext-authz-reason"
DENY_STATUS = 403
JSON_CONTENT_TYPE = "application/json"


def deny_body(reason: Reason) -> bytes:
    return json.dumps(
        {"error": "forbidden", "reason": reason.value}, separators=(",", ":")
    ).encode()


def deny_headers(reason: Reason) -> tuple[tuple[str, str], ...]:
    """The headers of a deny (besides ``content-type``), the same in both modes."""
    return (
        (REASON_HEADER, reason.value),
        (DENIED_HEADER, denied_value(DenialKind.EXTAUTHZ, reason.value)),
    )
