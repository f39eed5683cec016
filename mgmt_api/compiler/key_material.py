"""Key material users give is write-only: the one owner of its redaction.

Some kinds hold keys inline: an ExtAuthzPolicy's HMAC secrets and JWKS
(:mod:`mgmt_api.compiler.extauthz`), a SecuritySetting's local JWT keys
(:mod:`mgmt_api.compiler.local_jwt`). Anyone with READ on the object must not
get a secret back: with it they could mint tokens the gateway or the
sidecars accept. So each kind declares its key-bearing fields
(:class:`SecretField`, the kind's ``Behaviour.secrets``) and every REST read
replaces each secret value with a **marker** that carries a fingerprint; an
update that sends a marker back means "keep the stored secret with this
fingerprint". A GET → edit → PUT round trip therefore keeps the secrets
without the client ever holding them, and a client that does hold a secret
can tell whether it is the stored one by computing the fingerprint itself.

What is secret:

- a field of material ``SECRET`` (an HMAC secret), always;
- a field of material ``KEY`` (an inline JWKS, JWK or PEM) unless it is
  plainly public: JSON whose keys carry no private or symmetric member
  (:data:`PRIVATE_JWK_MEMBERS`), or PEM with only public keys and
  certificates. Anything else (a private key, text that is neither JSON nor
  PEM) is treated as secret, so a mistake is never echoed.

The marker is ``<redacted sha256:HHHHHHHHHHHHHHHH>``: the first 16 hex digits
of the SHA-256 of the value's UTF-8 bytes. It reveals nothing a token does
not (an HS256 token already allows an offline guess at a weak secret), and it
can be computed by any client.

What people read is redacted, what machines consume is not: REST objects
and the cluster's ``envoyconfig`` document (:func:`redact_envoy_config`, every
format) show markers; the ext_authz snapshots, the policy stream and ADS keep
the real values. In ``envoyconfig`` an inline JWKS keeps its shape (kids,
algorithms, public members) and each secret member shows as the marker of
that member, so the document still loads in Envoy and verifies no token.
"""

from __future__ import annotations

import base64
import copy
import enum
import hashlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from meshplane.jwk import PRIVATE_MEMBERS

_MARKER = re.compile(r"^<redacted sha256:([0-9a-f]{16})>$")
#: The JWK members that are private (RSA, EC, OKP) or symmetric (``oct``) key
#: material (RFC 7518 section 6; ``oth`` holds further RSA primes).
PRIVATE_JWK_MEMBERS = PRIVATE_MEMBERS
_PUBLIC_PEM_LABELS = frozenset({"PUBLIC KEY", "RSA PUBLIC KEY", "CERTIFICATE"})
_PEM_LABEL = re.compile(r"-----BEGIN ([A-Z0-9 ]+)-----")
#: An HMAC key shorter than the hash is refused (RFC 7518 section 3.2). It also
#: keeps the unkeyed fingerprint in the marker from helping a reader guess it.
MIN_HMAC_KEY_BYTES = 32
#: A list index in a :class:`SecretField` path: every item of the list.
EACH = "*"


class Material(enum.Enum):
    SECRET = "secret"  # noqa: S105 - a category: always secret (an HMAC key)
    KEY = "key"  # secret unless plainly public (a JWKS, JWK or PEM)


@dataclass(frozen=True)
class SecretField:
    """A key-bearing string field of a kind: its path in the spec and its material.

    ``path`` names mapping keys, with :data:`EACH` for every item of a list:
    ``("jwt", "keys", EACH, "hmacSecret", "value")``.
    """

    path: tuple[str, ...]
    material: Material

    def label(self) -> str:
        return ".".join(self.path).replace(f".{EACH}", "[]")


def fingerprint(value: str) -> str:
    """``sha256:`` and the first 16 hex digits of SHA-256 of ``value``."""
    return "sha256:" + hashlib.sha256(value.encode("utf-8")).hexdigest()[:16]


def marker(value: str) -> str:
    return f"<redacted {fingerprint(value)}>"


def is_marker(value: Any) -> bool:
    return isinstance(value, str) and _MARKER.match(value) is not None


def _jwk_is_secret(jwk: Any) -> bool:
    return not isinstance(jwk, dict) or bool(PRIVATE_JWK_MEMBERS & jwk.keys())


def is_secret_key(value: str) -> bool:
    """Whether inline key material (JWKS, JWK or PEM) holds anything but public keys."""
    try:
        doc = json.loads(value)
    except ValueError:
        return not is_public_pem(value)
    if isinstance(doc, dict) and "keys" in doc:
        keys = doc["keys"]
        return not isinstance(keys, list) or any(_jwk_is_secret(k) for k in keys)
    return _jwk_is_secret(doc)


def _b64url_len(text: str) -> int | None:
    try:
        return len(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
    except ValueError:
        return None


def jwks_problem(value: str) -> str | None:
    """Why ``value`` is not a usable inline JWKS, in words that never quote it; None if it is.

    Checked on write, so a bad set is a 400 naming the field rather than a
    config every proxy refuses, and so no short HMAC key is ever stored."""
    try:
        doc = json.loads(value)
    except ValueError:
        return 'is not JSON (a JWKS: {"keys": [{"kty": ...}]})'
    keys = doc.get("keys") if isinstance(doc, dict) else None
    if not isinstance(keys, list) or not keys:
        return 'is not a JWKS: it needs a non-empty "keys" list'
    for i, jwk in enumerate(keys):
        if not isinstance(jwk, dict) or not isinstance(jwk.get("kty"), str):
            return f'keys[{i}] is not a JWK (an object with "kty")'
        if jwk["kty"] == "oct":
            size = _b64url_len(jwk["k"]) if isinstance(jwk.get("k"), str) else None
            if size is None:
                return f'keys[{i}]: an oct key needs "k", base64url'
            if size < MIN_HMAC_KEY_BYTES:
                return (
                    f"keys[{i}]: an HMAC key (k) must be at least {MIN_HMAC_KEY_BYTES} bytes "
                    "(RFC 7518 section 3.2); generate one, e.g. `openssl rand 32 | basenc "
                    "--base64url`"
                )
    return None


def is_public_pem(value: str) -> bool:
    """Whether ``value`` is PEM holding public keys and certificates only."""
    labels = _PEM_LABEL.findall(value)
    return bool(labels) and all(label in _PUBLIC_PEM_LABELS for label in labels)


def is_secret(material: Material, value: str) -> bool:
    return material is Material.SECRET or is_secret_key(value)


def _holders(
    node: Any, path: tuple[str, ...], where: str
) -> Iterator[tuple[str, dict[str, Any], str]]:
    """(field name relative to the spec, the mapping holding the value, its key)."""
    if not path or node is None:
        return
    head, rest = path[0], path[1:]
    if head == EACH:
        for i, item in enumerate(node if isinstance(node, list) else []):
            yield from _holders(item, rest, f"{where}[{i}]")
        return
    if not isinstance(node, dict):
        return
    name = f"{where}.{head}" if where else head
    if not rest:
        if isinstance(node.get(head), str):
            yield name, node, head
        return
    yield from _holders(node.get(head), rest, name)


def _values(
    spec: Any, fields: tuple[SecretField, ...]
) -> Iterator[tuple[SecretField, str, dict[str, Any], str]]:
    for field in fields:
        for name, holder, key in _holders(spec, field.path, ""):
            yield field, name, holder, key


def redact(spec: dict[str, Any], fields: tuple[SecretField, ...]) -> dict[str, Any]:
    """A copy of ``spec`` with every secret value of ``fields`` replaced by its marker."""
    if not fields:
        return spec
    out = copy.deepcopy(spec)
    for field, _, holder, key in _values(out, fields):
        value = holder[key]
        if not is_marker(value) and is_secret(field.material, value):
            holder[key] = marker(value)
    return out


class UnknownMarker(ValueError):
    """A marker that matches none of the stored secrets."""

    def __init__(self, field: str) -> None:
        super().__init__(field)
        self.field = field


def restore(
    spec: dict[str, Any], stored: dict[str, Any] | None, fields: tuple[SecretField, ...]
) -> dict[str, Any]:
    """``spec`` with each marker replaced by the stored secret it fingerprints.

    Matching is by fingerprint, not position, so keys may be reordered or
    added around a kept one (a marker is looked up among the stored values of
    every key-bearing field of the object). Raises :class:`UnknownMarker`
    (with the field relative to the object: ``jwt.keys[1].hmacSecret.value``)
    for a marker whose secret is not stored on this object: a marker copied
    from another object, or a secret that changed since the GET.
    """
    known = {fingerprint(h[k]): h[k] for _, _, h, k in _values(stored, fields)}
    out = copy.deepcopy(spec)
    for _, name, holder, key in _values(out, fields):
        match = _MARKER.match(holder[key])
        if match is None:
            continue
        secret = known.get("sha256:" + match.group(1))
        if secret is None:
            raise UnknownMarker(name)
        holder[key] = secret
    return out


def first_marker(spec: dict[str, Any], fields: tuple[SecretField, ...]) -> str | None:
    """The field of the first marker left in ``spec`` (relative to the object), if any."""
    return next((n for _, n, h, k in _values(spec, fields) if is_marker(h[k])), None)


# ---- the envoyconfig document ------------------------------------------------

# DataSource holders whose inline value is key material (jwt_authn providers).
_KEY_SOURCES = frozenset({"localJwks", "local_jwks"})
_INLINE = frozenset({"inlineString", "inline_string", "inlineBytes", "inline_bytes"})


def _redact_jwk(jwk: dict[str, Any]) -> dict[str, Any]:
    """A JWK with each private or symmetric member replaced by the member's marker.

    An ``oct`` key's ``k`` becomes the base64url of its marker: Envoy refuses a
    JWKS whose only key has a ``k`` that is not base64url, and the document
    must still load (it then verifies no token: it fails closed)."""
    out = dict(jwk)
    for member in PRIVATE_JWK_MEMBERS & jwk.keys():
        value = jwk[member]
        text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
        out[member] = marker(text)
        if member == "k":
            out[member] = base64.urlsafe_b64encode(out[member].encode()).decode().rstrip("=")
    return out


def redact_key_text(value: str) -> str:
    """Inline key material as people may read it: a JWKS (or JWK) keeps its shape
    and public members, each secret member shows as its marker; anything else
    secret (a private PEM, text that is no key) is replaced by one marker."""
    if not is_secret_key(value):
        return value
    try:
        doc = json.loads(value)
    except ValueError:
        return marker(value)
    keys = doc.get("keys") if isinstance(doc, dict) else None
    if isinstance(keys, list) and all(isinstance(k, dict) for k in keys):
        return json.dumps({**doc, "keys": [_redact_jwk(k) for k in keys]}, separators=(",", ":"))
    if isinstance(doc, dict) and "keys" not in doc:
        return json.dumps(_redact_jwk(doc), separators=(",", ":"))
    return marker(value)


def redact_envoy_config(document: Any) -> Any:
    """A copy of a protojson Envoy config with every key secret replaced (:func:`redact_key_text`).

    Structural where the place is known (the inline source of a jwt_authn
    ``localJwks``), and by content anywhere else (a private PEM block, a JWK
    with private members), so a key that reaches a new place of the document
    stays hidden.
    """

    def walk(value: Any, key_source: bool) -> Any:
        if isinstance(value, dict):
            return {
                k: leaf(v, key_source and k in _INLINE)
                if isinstance(v, str)
                else walk(v, k in _KEY_SOURCES)
                for k, v in value.items()
            }
        if isinstance(value, list):
            return [walk(v, False) for v in value]
        return leaf(value, False) if isinstance(value, str) else value

    def leaf(value: str, inline_key: bool) -> str:
        if inline_key or '"kty"' in value:
            return redact_key_text(value)
        return marker(value) if "PRIVATE KEY-----" in value else value

    return walk(document, False)
