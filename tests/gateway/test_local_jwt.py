"""Local JWT rules (issue 24, item 6; spec 4.11.8) through a real gateway Envoy.

The security group's SecuritySetting carries ``authorization.http.local``
(rules on verified claims, paths and methods, and an inline JWKS) and no
ext_authz server, so mgmt-api compiles it into Envoy's own ``jwt_authn`` and
``rbac`` filters over ADS and the gateway decides alone: a missing or invalid
token is 401, a verified token that no rule allows is 403.

Routes: ``secure.web`` (every path, namespace ``secure``, which the setting
selects) and ``default.open`` (``/open``, which no setting selects).
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypedDict

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm

from tests.mgmt_api.harness import ok
from tests.support.gateway import GROUP_PATH, Gateway, GatewayStack
from tests.support.processes import wait_until

ISSUER = "https://idp.test"
KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
OTHER_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
RULES = [
    {
        "from": [{"jwt": {"iss": ISSUER, "sub": "alice"}}],
        "to": [{"paths": ["/api/*"], "methods": ["GET"]}],
    },
    {
        "from": [{"jwt": {"iss": ISSUER, "other": {"role": "admin"}}}],
        "to": [{"paths": ["/admin", "/admin/*"]}],
    },
]


# An HMAC key in the same set (kid h1): the setting then holds a secret, which
# reads back as a marker and must survive a GET -> PUT round trip.
HMAC_KEY = b"local-jwt-test-hmac-key-of-32-bytes-or-more"


def jwks() -> str:
    public = json.loads(RSAAlgorithm.to_jwk(KEY.public_key()))
    oct_key = {
        "kty": "oct",
        "kid": "h1",
        "alg": "HS256",
        "k": base64.urlsafe_b64encode(HMAC_KEY).decode().rstrip("="),
    }
    return json.dumps({"keys": [{**public, "kid": "k1", "alg": "RS256", "use": "sig"}, oct_key]})


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayStack]:
    st = GatewayStack(Path(tmp_path_factory.mktemp("localjwt")))
    try:
        st.backend("default.app")
        st.route("secure.web", "/")
        st.route("default.open", "/open")
        st.jwt_security("local-jwt-test-unused-hmac-secret-0123")
        local = {"rules": RULES, "keys": {"jwks": {"value": jwks()}}}
        setting = {"authorization": {"mode": "CLUSTER", "http": {"local": local}}}
        st.put(f"{GROUP_PATH}/settings", "s", "securitySetting", setting)
        st.gateway()
        st.converged()
        yield st
    finally:
        st.close()


@pytest.fixture(scope="module")
def gateway(stack: GatewayStack) -> Gateway:
    return stack.gateways[0]


def token(key: Any = KEY, ttl: int = 600, nbf_in: int = 0, **claims: Any) -> str:
    now = int(time.time())
    payload = {"iss": ISSUER, "nbf": now + nbf_in, "exp": now + ttl, **claims}
    return jwt.encode(payload, key, algorithm="RS256", headers={"kid": "k1"})


def unsigned(**claims: Any) -> str:
    now = int(time.time())
    payload = {"iss": ISSUER, "nbf": now, "exp": now + 600, **claims}

    def part(obj: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()

    return f"{part({'alg': 'none', 'typ': 'JWT', 'kid': 'k1'})}.{part(payload)}."


class Claims(TypedDict, total=False):
    """The claims these tests vary (``token`` adds iss, nbf and exp)."""

    sub: str
    role: str
    iss: str


ALICE: Claims = {"sub": "alice"}
ADMIN: Claims = {"sub": "bob", "role": "admin"}


@pytest.mark.parametrize(
    ("method", "path", "claims", "expected"),
    [
        ("GET", "/api/items", ALICE, 200),  # rule 0: iss + sub, GET under /api/
        ("POST", "/api/items", ALICE, 403),  # rule 0 allows GET only
        ("GET", "/admin", ALICE, 403),  # alice has no admin rule
        ("GET", "/admin/panel", ADMIN, 200),  # rule 1: the role claim
        ("DELETE", "/admin", ADMIN, 200),  # rule 1 names no method
        ("GET", "/api/items", ADMIN, 403),  # bob is not alice
        ("GET", "/api/items", {"sub": "alice", "iss": "https://evil.test"}, 403),
        ("GET", "/api/items", {"sub": "bob", "role": "user"}, 403),
        ("GET", "/elsewhere", ADMIN, 403),  # no rule covers the path
    ],
)
def test_the_rules_table(
    gateway: Gateway, method: str, path: str, claims: Claims, expected: int
) -> None:
    assert gateway.raw_status(path, method, token(**claims)) == expected


#: Built when the test runs, not at collection: a suite runs for minutes, and a
#: not-yet-valid token made at collection would be valid by then.
BAD_TOKENS: dict[str, Any] = {
    "no token": lambda: None,
    "garbage": lambda: "not-a-jwt",
    "alg none": lambda: unsigned(**ALICE),
    "a key not in the set": lambda: token(OTHER_KEY, **ALICE),
    "expired": lambda: token(ttl=-60, **ALICE),
    "not yet valid": lambda: token(nbf_in=300, **ALICE),
}


@pytest.mark.parametrize("why", list(BAD_TOKENS))
def test_a_missing_or_unverifiable_token_is_401(gateway: Gateway, why: str) -> None:
    response = gateway.get("/api/items", BAD_TOKENS[why]())
    assert response.status_code == 401, why
    assert "www-authenticate" in {k.lower() for k in response.headers}, why


@pytest.mark.parametrize(
    "target", ["/api/../admin", "/api/%2e%2e/admin", "/api/%2E%2E/admin", "//admin"]
)
def test_path_tricks_cannot_reach_a_path_no_rule_allows(gateway: Gateway, target: str) -> None:
    """Each is ``/admin`` once normalized, which alice's rule does not allow."""
    assert gateway.raw_status(target, "GET", token(**ALICE)) == 403


def test_a_get_put_round_trip_keeps_the_hmac_key_enforced(stack: GatewayStack) -> None:
    """The setting reads back with its key as a marker; sending the marker back with a
    new rule keeps the key: a token signed with it passes the new rule once live."""
    gateway = stack.gateways[0]
    now = int(time.time())
    claims = {"iss": ISSUER, "sub": "hmac", "nbf": now, "exp": now + 600}
    hs256 = jwt.encode(claims, HMAC_KEY, algorithm="HS256", headers={"kid": "h1"})
    assert gateway.raw_status("/hmac-check", "GET", hs256) == 403  # verified, no rule yet
    path = f"{GROUP_PATH}/settings/s"
    got = ok(stack.admin.get(path))
    local = got["authorization"]["http"]["local"]
    assert local["keys"]["jwks"]["value"].startswith("<redacted sha256:")
    assert "hmac" not in json.dumps(got)  # the key id is inside the redacted value
    local["rules"] = [
        *local["rules"],
        {"from": [{"jwt": {"iss": ISSUER, "sub": "hmac"}}], "to": [{"paths": ["/hmac-check"]}]},
    ]
    ok(stack.admin.put(path, json=got))
    wait_until(
        lambda: gateway.raw_status("/hmac-check", "GET", hs256) == 200,
        timeout=60,
        what="the new rule, verified with the kept HMAC key",
    )
    assert gateway.raw_status("/api/items", "GET", token(**ALICE)) == 200


def test_an_unselected_namespace_is_not_checked(gateway: Gateway) -> None:
    assert gateway.get("/open/x").status_code == 200


def test_no_ext_authz_filter_is_configured_for_local_rules(gateway: Gateway) -> None:
    """The gateway decides alone: its listener has jwt_authn and rbac, no ext_authz."""
    dump = gateway.envoy.admin("GET", "/config_dump?resource=dynamic_listeners").text
    assert "envoy.filters.http.jwt_authn" in dump
    assert "envoy.filters.http.rbac" in dump
    assert "envoy.filters.http.ext_authz" not in dump
