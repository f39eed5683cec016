"""Wire renderings of a Decision shared by both adapters.

The deny body is short, fixed JSON naming only the reason code, e.g.
``{"error":"forbidden","reason":"expired"}``; the same code goes into the
``x-ext-authz-reason`` header. Nothing from the request (and never the
token) is echoed.
"""

from __future__ import annotations

import json

from extauthz.reasons import Reason

REASON_HEADER = "x-ext-authz-reason"
DENY_STATUS = 403
JSON_CONTENT_TYPE = "application/json"


def deny_body(reason: Reason) -> bytes:
    return json.dumps(
        {"error": "forbidden", "reason": reason.value}, separators=(",", ":")
    ).encode()
