"""Secret key material of an ExtAuthzPolicy is write-only through REST.

A policy holds its keys inline (see :mod:`mgmt_api.compiler.extauthz`), and
anyone with READ on a policy must not get its HMAC secret back: with it they
could mint tokens the gateway accepts. So every REST read replaces each
secret value with a **marker** that carries a fingerprint, and an update that
sends a marker back means "keep the stored secret with this fingerprint".
A GET → edit → PUT round trip therefore keeps the secrets without the client
ever holding them, and a client that does hold a secret can tell whether it
is the stored one by computing the fingerprint itself.

What is secret, per entry of ``jwt.keys``:

- ``hmacSecret.value``, always;
- ``jwks.value`` (an inline JWKS) when it holds symmetric (``k``) or private
  (``d``) members, or is not JSON at all (it is then refused by the loader
  anyway, and nothing about it is echoed);
- ``publicKeyPem.value`` only if it holds a private key (a mistake the loader
  refuses, but the value is not echoed either).

The marker is ``<redacted sha256:HHHHHHHHHHHHHHHH>``: the first 16 hex digits
of the SHA-256 of the value's UTF-8 bytes. It reveals nothing a token does
not (an HS256 token already allows an offline guess at a weak secret), and it
can be computed by any client. The management plane and the ext_authz
snapshots keep the real values; only REST output is redacted.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from typing import Any

_MARKER = re.compile(r"^<redacted sha256:([0-9a-f]{16})>$")
_MATERIAL = ("hmacSecret", "publicKeyPem", "jwks")


def fingerprint(value: str) -> str:
    """``sha256:`` and the first 16 hex digits of SHA-256 of ``value``."""
    return "sha256:" + hashlib.sha256(value.encode("utf-8")).hexdigest()[:16]


def marker(value: str) -> str:
    return f"<redacted {fingerprint(value)}>"


def is_marker(value: Any) -> bool:
    return isinstance(value, str) and _MARKER.match(value) is not None


def _jwks_is_secret(value: str) -> bool:
    try:
        doc = json.loads(value)
    except ValueError:
        return True
    keys = doc.get("keys") if isinstance(doc, dict) else None
    if not isinstance(keys, list):
        return True
    return any(not isinstance(k, dict) or "k" in k or "d" in k for k in keys)


def _is_secret(kind: str, value: str) -> bool:
    if kind == "hmacSecret":
        return True
    if kind == "jwks":
        return _jwks_is_secret(value)
    return "PRIVATE KEY" in value


def _secret_values(spec: Any) -> list[tuple[str, dict[str, Any]]]:
    """(material kind, the ``{value: ...}`` mapping) of every inline key of ``spec``."""
    keys = ((spec or {}).get("jwt") or {}).get("keys") if isinstance(spec, dict) else None
    out: list[tuple[str, dict[str, Any]]] = []
    for entry in keys if isinstance(keys, list) else []:
        if not isinstance(entry, dict):
            continue
        for kind in _MATERIAL:
            material = entry.get(kind)
            if isinstance(material, dict) and isinstance(material.get("value"), str):
                out.append((kind, material))
    return out


def redact(spec: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``spec`` with every secret value replaced by its marker."""
    out = copy.deepcopy(spec)
    for kind, material in _secret_values(out):
        value = material["value"]
        if not is_marker(value) and _is_secret(kind, value):
            material["value"] = marker(value)
    return out


class UnknownMarker(ValueError):
    """A marker that matches none of the stored secrets."""

    def __init__(self, field: str) -> None:
        super().__init__(field)
        self.field = field


def restore(spec: dict[str, Any], stored: dict[str, Any] | None) -> dict[str, Any]:
    """``spec`` with each marker replaced by the stored secret it fingerprints.

    Matching is by fingerprint, not position, so keys may be reordered or
    added around a kept one. Raises :class:`UnknownMarker` (with the field,
    relative to the policy: ``jwt.keys[1].hmacSecret.value``) for a marker
    whose secret is not stored on this object: a marker copied from another
    policy, or a secret that changed since the GET.
    """
    known = {fingerprint(m["value"]): m["value"] for _, m in _secret_values(stored)}
    out = copy.deepcopy(spec)
    keys = (out.get("jwt") or {}).get("keys")
    for i, entry in enumerate(keys if isinstance(keys, list) else []):
        if not isinstance(entry, dict):
            continue
        for kind in _MATERIAL:
            material = entry.get(kind)
            if not isinstance(material, dict) or not is_marker(material.get("value")):
                continue
            match = _MARKER.match(material["value"])
            assert match is not None
            secret = known.get("sha256:" + match.group(1))
            if secret is None:
                raise UnknownMarker(f"jwt.keys[{i}].{kind}.value")
            material["value"] = secret
    return out


def first_marker(spec: dict[str, Any]) -> str | None:
    """The field of the first marker left in ``spec`` (relative to the policy), if any."""
    keys = (spec.get("jwt") or {}).get("keys")
    for i, entry in enumerate(keys if isinstance(keys, list) else []):
        if not isinstance(entry, dict):
            continue
        for kind in _MATERIAL:
            material = entry.get(kind)
            if isinstance(material, dict) and is_marker(material.get("value")):
                return f"jwt.keys[{i}].{kind}.value"
    return None
