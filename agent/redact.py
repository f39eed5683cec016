"""Secrets never leave the cluster: redaction of config dumps before they cross the tunnel.

Envoy already hides the fields its protos mark sensitive (TLS private keys,
SDS generic secrets) as ``[redacted]``. It cannot know what hides in
free-form places: metadata structs, header values a route adds, inline
strings of filters it does not annotate. So the agent redacts again, by two
rules that do not depend on the Envoy version:

- by name: the value of any key that names a credential (``private_key``,
  ``password``, ``secret``, ``token``, ``api_key``, ``client_secret``,
  ``credential``, ``authorization``, ...), whatever its type;
- by content: any string holding a PEM private key block, and
  ``key``/``value`` pairs of headers whose name is a credential header
  (``authorization``, ``cookie``, ``x-api-key``, ...).

Pure: no I/O; table-tested in ``tests/agent/test_redact.py``.
"""

from __future__ import annotations

import re
from typing import Any

REDACTED = "[redacted]"

# Key names (lower-cased, without ``_`` and ``-``) whose values are secrets.
_SECRET_KEYS = frozenset(
    {
        "privatekey",
        "password",
        "passwd",
        "secret",
        "secrets",
        "clientsecret",
        "hmacsecret",
        "token",
        "accesstoken",
        "refreshtoken",
        "idtoken",
        "bearertoken",
        "apikey",
        "accesskey",
        "secretaccesskey",
        "sessiontoken",
        "credential",
        "credentials",
        "authorization",
        "sessionticketkeys",
        "signingkey",
        "encryptionkey",
        "inlinesecret",
    }
)
# Header names whose values are credentials (in header_value_option lists).
_SECRET_HEADERS = frozenset(
    {"authorization", "proxy-authorization", "cookie", "set-cookie", "x-api-key", "api-key"}
)
_PEM_PRIVATE = re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----")


def _normal(key: str) -> str:
    return key.lower().replace("_", "").replace("-", "")


def _is_secret_key(key: str) -> bool:
    normal = _normal(key)
    return normal in _SECRET_KEYS or normal.endswith(("password", "secret", "privatekey"))


def redact(document: Any) -> tuple[Any, int]:
    """A copy of ``document`` with every secret replaced, and how many were."""
    count = 0

    def walk(value: Any) -> Any:
        nonlocal count
        if isinstance(value, dict):
            out: dict[str, Any] = {}
            header = value.get("key")
            secret_header = isinstance(header, str) and header.lower() in _SECRET_HEADERS
            for key, item in value.items():
                if (_is_secret_key(key) or (secret_header and key == "value")) and item not in (
                    REDACTED,
                    "",
                    None,
                ):
                    out[key] = REDACTED
                    count += 1
                else:
                    out[key] = walk(item)
            return out
        if isinstance(value, list):
            return [walk(item) for item in value]
        if isinstance(value, str) and _PEM_PRIVATE.search(value):
            count += 1
            return REDACTED
        return value

    return walk(document), count
