"""What counts as secret key material, and how it reads back (mgmt_api.compiler.key_material): pure.

The REST round trip of every kind is in ``tests/mgmt_api/test_write_only_secrets.py``.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from mgmt_api.compiler import key_material as km
from mgmt_api.compiler.key_material import EACH, Material, SecretField

PUBLIC_PEM = "-----BEGIN PUBLIC KEY-----\nMIIB\n-----END PUBLIC KEY-----\n"
PRIVATE_PEM = "-----BEGIN PRIVATE KEY-----\nMIIE\n-----END PRIVATE KEY-----\n"
OCT = {"kty": "oct", "kid": "h", "k": "c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0LXNlY3JldC0zNg"}
RSA_PUBLIC = {"kty": "RSA", "kid": "r", "n": "0vx7", "e": "AQAB"}


@pytest.mark.parametrize(
    ("value", "secret"),
    [
        (json.dumps({"keys": [RSA_PUBLIC]}), False),
        (json.dumps(RSA_PUBLIC), False),
        (PUBLIC_PEM, False),
        (json.dumps({"keys": [OCT]}), True),
        (json.dumps({"keys": [RSA_PUBLIC, {**RSA_PUBLIC, "d": "x"}]}), True),
        (json.dumps({"keys": [{"kty": "EC", "x": "a", "y": "b", "d": "c"}]}), True),
        (json.dumps({"keys": [{**RSA_PUBLIC, "oth": [{"r": "a"}]}]}), True),
        (PRIVATE_PEM, True),
        (PUBLIC_PEM + PRIVATE_PEM, True),
        ("not a key at all", True),  # never echoed: it may be a secret pasted by mistake
        (json.dumps({"keys": "oops"}), True),
    ],
)
def test_is_secret_key(value: str, secret: bool) -> None:
    assert km.is_secret_key(value) is secret


FIELDS = (
    SecretField(("a", "keys", EACH, "hmac"), Material.SECRET),
    SecretField(("a", "jwks"), Material.KEY),
)


def test_redact_restore_and_refuse() -> None:
    jwks = json.dumps({"keys": [OCT]})
    spec: dict[str, Any] = {"a": {"keys": [{"hmac": "one"}, {"hmac": "two"}], "jwks": jwks}}
    shown = km.redact(spec, FIELDS)
    assert shown["a"]["keys"] == [{"hmac": km.marker("one")}, {"hmac": km.marker("two")}]
    assert shown["a"]["jwks"] == km.marker(jwks) and spec["a"]["jwks"] == jwks
    # reordered and edited around the markers: each restored by its fingerprint
    sent = {"a": {"keys": [shown["a"]["keys"][1], {"hmac": "three"}], "jwks": shown["a"]["jwks"]}}
    assert km.restore(sent, spec, FIELDS) == {
        "a": {"keys": [{"hmac": "two"}, {"hmac": "three"}], "jwks": jwks}
    }
    assert km.first_marker(sent, FIELDS) == "a.keys[0].hmac"
    with pytest.raises(km.UnknownMarker) as caught:
        km.restore({"a": {"keys": [{"hmac": km.marker("other")}]}}, spec, FIELDS)
    assert caught.value.field == "a.keys[0].hmac"
    public = {"a": {"jwks": json.dumps({"keys": [RSA_PUBLIC]})}}
    assert km.redact(public, FIELDS) == public


def test_envoy_config_keeps_the_jwks_shape_and_loads() -> None:
    rsa_private = {**RSA_PUBLIC, "d": "dddd", "p": "pppp"}
    inline = json.dumps({"keys": [OCT, rsa_private]})
    document = {
        "providers": {"p": {"localJwks": {"inlineString": inline}, "forward": False}},
        "other": {"localJwks": {"inlineString": "garbage"}},
        "pem": PRIVATE_PEM,
        "public": {"localJwks": {"inlineString": PUBLIC_PEM}},
    }
    out = km.redact_envoy_config(document)
    keys = json.loads(out["providers"]["p"]["localJwks"]["inlineString"])["keys"]
    # k stays base64url (Envoy refuses a JWKS whose only key's k is not), decoding to the marker
    padded = keys[0]["k"] + "=" * (-len(keys[0]["k"]) % 4)
    assert base64.urlsafe_b64decode(padded).decode() == km.marker(OCT["k"])
    assert keys[1] == {**RSA_PUBLIC, "d": km.marker("dddd"), "p": km.marker("pppp")}
    assert out["providers"]["p"]["forward"] is False
    assert out["other"]["localJwks"]["inlineString"] == km.marker("garbage")
    assert out["pem"] == km.marker(PRIVATE_PEM)
    assert out["public"] == document["public"]
    assert "c2VjcmV0" not in json.dumps(out) and "dddd" not in json.dumps(out)


SHORT_K = base64.urlsafe_b64encode(b"short-hmac-key-31-bytes-long-xx").decode().rstrip("=")


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        (json.dumps({"keys": [OCT, RSA_PUBLIC]}), None),
        ("secret-pasted-as-text", "is not JSON"),
        (json.dumps({"keys": []}), "non-empty"),
        (json.dumps(RSA_PUBLIC), "non-empty"),
        (json.dumps({"keys": [{"kid": "x"}]}), "keys[0] is not a JWK"),
        (json.dumps({"keys": [RSA_PUBLIC, {"kty": "oct"}]}), 'keys[1]: an oct key needs "k"'),
        (json.dumps({"keys": [{"kty": "oct", "k": SHORT_K}]}), "at least 32 bytes"),
    ],
)
def test_jwks_problem_never_quotes_the_value(value: str, problem: str | None) -> None:
    said = km.jwks_problem(value)
    assert (said is None) if problem is None else (said is not None and problem in said)
    assert said is None or (SHORT_K not in said and "secret-pasted" not in said)
