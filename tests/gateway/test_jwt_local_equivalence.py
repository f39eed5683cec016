"""The path-claim policy inside Envoy decides exactly as the extauthz service does.

One real gateway Envoy (compiled by :func:`mgmt_api.compiler.gateway_xds.compile_gateway`)
serves every ExtAuthzPolicy of extauthz's decision table twice: on host
``{policy}.local`` with ``enforcement: local`` (jwt_authn and the Lua check,
ext_authz only for what the check refers) and on host ``{policy}.external``
with ``enforcement: external`` (every request asks the real extauthz service).
Every request is sent byte for byte to both hosts; the verdict (status code
and ``x-ext-authz-reason``) must be the same. The table: every case of
``tests/extauthz/cases.py`` an HTTP/1.1 request can carry (the built-in
``allow``/``deny`` and unknown policies select no ExtAuthzPolicy and are
left out), the path tricks of ``tests/extauthz/test_paths.py``, the path
claims that test refuses or accepts, tokens the local form must refer
(``alg: none``, wrong keys, expired, not yet valid, ``nbf`` missing, bad
base64), a prefix at and off a segment boundary, and seeded random cases.
"""

from __future__ import annotations

import json
import random
import re
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from meshplane import gateway_contract as gc
from mgmt_api.compiler import envoy_config, gateway_xds
from mgmt_api.compiler import extauthz as extauthz_compiler
from mgmt_api.compiler.extauthz import StoredPolicy
from mgmt_api.compiler.http_route import Backend, HTTPRoute
from tests.extauthz.cases import CASES
from tests.extauthz.jwtkit import (
    HS_SECRET,
    OTHER_SECRET,
    b64path,
    claims,
    ec_key,
    make_token,
    public_jwk,
    public_pem,
    rsa_key,
)
from tests.extauthz.support import ServerThread, app_factory
from tests.support.envoy import EnvoyProcess
from tests.support.gateway import upstream_bootstrap
from tests.support.net import free_ports

NOW = time.time()
_HS = {"hmacSecret": {"value": HS_SECRET.decode()}}
_RS = {"publicKeyPem": {"value": public_pem(rsa_key()).decode()}}
_ES = {"jwks": {"value": json.dumps({"keys": [public_jwk(ec_key(), "es-1", "ES256")]})}}

#: The policies of ``tests/extauthz/policies.py`` as stored ExtAuthzPolicies (keys inline).
POLICIES: dict[str, dict[str, Any]] = {
    "hs": {"jwt": {"algorithms": ["HS256"], "keys": [_HS]}, "pathClaim": {"name": "path"}},
    "seg": {"jwt": {"algorithms": ["HS256"], "keys": [_HS]}, "pathClaim": {"match": "SEGMENT"}},
    "rs": {"jwt": {"algorithms": ["RS256"], "keys": [_RS]}, "pathClaim": {"name": "path"}},
    "mixed": {
        "jwt": {"algorithms": ["HS256", "RS256"], "keys": [_HS, _RS]},
        "pathClaim": {"name": "path"},
    },
    "es": {"jwt": {"algorithms": ["ES256"], "keys": [_ES]}, "pathClaim": {"name": "path"}},
    "iss": {
        "jwt": {
            "algorithms": ["HS256"],
            "keys": [_HS],
            "issuer": "https://idp.example",
            "audiences": ["api", "other"],
            "leewaySeconds": 30,
        }
    },
    "strip": {
        "jwt": {"algorithms": ["HS256"], "keys": [_HS]},
        "pathClaim": {"name": "path"},
        "removeAuthorization": True,
    },
}
DEFAULT = "hs"
MODES = ("local", "external")
ORG_CLUSTER = "organizations/o/clusters/c1"
GROUP = "organizations/o/tenants/t/workspaces/w/securitygroups/g"


def _published(policy: str, mode: str) -> str:
    return f"{policy}-{mode}"


def _gateway_input(upstream_port: int) -> gateway_xds.GatewayInput:
    """Per policy and mode: a namespace, its Backend, an HTTPRoute for host
    ``{policy}.{mode}`` and a SecuritySetting entry selecting the namespace."""
    routes, backends, authz, specs = [], [], [], []
    for policy, spec in POLICIES.items():
        for mode in MODES:
            namespace = f"{policy}-{mode}"
            name = _published(policy, mode)
            specs.append((name, {**spec, "enforcement": mode}))
            backends.append(
                (
                    f"{ORG_CLUSTER}/backends/{namespace}.app",
                    Backend.model_validate(
                        {
                            "metadata": {"namespace": namespace, "name": "app"},
                            "spec": {
                                "endpoints": [
                                    {"ip": {"address": "127.0.0.1", "port": upstream_port}}
                                ]
                            },
                        }
                    ),
                )
            )
            ref = {"group": "gateway.envoyproxy.io", "kind": "Backend", "name": "app"}
            rule = {
                "matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
                "backendRefs": [ref],
            }
            routes.append(
                (
                    f"{ORG_CLUSTER}/httproutes/{namespace}.web",
                    HTTPRoute.model_validate(
                        {
                            "metadata": {"namespace": namespace, "name": "web"},
                            "spec": {"hostnames": [f"{policy}.{mode}"], "rules": [rule]},
                        }
                    ),
                )
            )
            authz.append(
                envoy_config.ExtAuthzRoute(
                    setting=f"{GROUP}/settings/{namespace}",
                    group=GROUP,
                    namespaces=(namespace,),
                    uri="grpc://127.0.0.1:1",  # replaced below with the real port
                    policy=name,
                )
            )
    policies = envoy_config.EnvoyConfigInput(
        cluster_fqn=ORG_CLUSTER,
        cluster="c1",
        traffic_policies=(),
        ext_authz=tuple(authz),
        extauthz_policies=tuple(specs),
    )
    return gateway_xds.GatewayInput(policies, tuple(routes), tuple(backends))


def _static(resources: gateway_xds.GatewayResources) -> dict[str, Any]:
    """The compiled resources as one static bootstrap (RDS inlined)."""
    listener = json.loads(json.dumps(resources.listeners[0]))
    manager = listener["filterChains"][0]["filters"][0]["typedConfig"]
    del manager["rds"]
    manager["routeConfig"] = resources.route_configurations[0]
    return {
        "node": {"id": "gw", "cluster": "o/c1"},
        "admin": {"address": {"socketAddress": {"address": "127.0.0.1", "portValue": 0}}},
        "staticResources": {"listeners": [listener], "clusters": list(resources.clusters)},
    }


class Verdicts:
    """Sends one raw HTTP/1.1 request to a host of the gateway; returns (status, reason)."""

    def __init__(self, port: int, gateway: EnvoyProcess) -> None:
        self.port = port
        self.gateway = gateway
        self.last_headers: dict[str, str] = {}

    def checks(self) -> int:
        """The Checks the gateway has sent to extauthz so far (Envoy's own count)."""
        stats = self.gateway.admin("GET", "/stats?filter=^cluster.extauthz.upstream_rq_total$")
        return int(stats.text.split(":")[1]) if ":" in stats.text else 0

    def ask(self, host: str, target: str, auth: tuple[str, ...]) -> tuple[int, str]:
        lines = [f"GET {target} HTTP/1.1", f"Host: {host}"]
        lines += [f"Authorization: {value}" for value in auth]
        request = ("\r\n".join([*lines, "Connection: close"]) + "\r\n\r\n").encode("latin-1")
        with socket.create_connection(("127.0.0.1", self.port), timeout=20) as conn:
            conn.sendall(request)
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                data += chunk
        head = data.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
        status = int(head[0].split(" ", 2)[1])
        found = {}
        for line in head[1:]:
            name, _, value = line.partition(":")
            found[name.strip().lower()] = value.strip()
        self.last_headers = found
        return status, found.get("x-ext-authz-reason", "")


@pytest.fixture(scope="module")
def verdicts() -> Iterator[Verdicts]:
    upstream_port, gateway_port = free_ports(2)
    with tempfile.TemporaryDirectory(prefix="meshplane-jwt-eq-") as tmp:
        config = Path(tmp) / "extauthz.yaml"
        inp = _gateway_input(upstream_port)
        # The config input keeps the specs as plain mappings; they are the stored policies
        # _gateway_input put there (the enforcement service casts the same way).
        stored = [(n, cast(StoredPolicy, s)) for n, s in inp.policies.extauthz_policies]
        config.write_bytes(extauthz_compiler.render_file(stored))
        upstream = EnvoyProcess(upstream_bootstrap(upstream_port), Path(tmp) / "up").start()
        try:
            with ServerThread(app_factory(config)) as authz:
                uri = f"grpc://127.0.0.1:{authz.port}"
                routes = tuple(
                    envoy_config.ExtAuthzRoute(r.setting, r.group, r.namespaces, uri, r.policy)
                    for r in inp.policies.ext_authz
                )
                policies = envoy_config.EnvoyConfigInput(
                    **{**inp.policies.__dict__, "ext_authz": routes}
                )
                inp = gateway_xds.GatewayInput(policies, inp.http_routes, inp.backends)
                node = gc.GatewayNode("o", "c1", "gw-1", "127.0.0.1", gateway_port)
                resources = gateway_xds.compile_gateway(inp, node)
                gateway = EnvoyProcess(_static(resources), Path(tmp) / "gw").start()
                try:
                    yield Verdicts(gateway_port, gateway)
                finally:
                    gateway.stop()
        finally:
            upstream.stop()


def _bearer(token: str) -> tuple[str, ...]:
    return (f"Bearer {token}",)


def _token(path: str | None = "/headers", **extra: Any) -> str:
    return make_token(claims(NOW, path=path, **extra))


def _raw_claim(value: Any) -> str:
    return make_token(claims(NOW, path=None) | {"path": value})


# --- the table ---------------------------------------------------------------------

PATH_TRICKS = [
    "/headers",
    "/headers?x=1",
    "/headers#frag",
    "/headers?a=/../admin",
    "/headers/a/b/../c",
    "/headers/./b/.",
    "/headers/..",
    "/../../headers",
    "/%68eaders",
    "/headers/%2e%2e/admin",
    "/headers/%2E%2E/admin",
    "//headers",
    "/headers//b///c",
    "/headers/caf%C3%A9",
    "/headers..b/c.d",
    "/Headers",
    "/headers;v=1/x",
    "/headers;b/../c",
    "/headers%2Fb",
    "/headers%2fb",
    "/headers%5Cb",
    "/headers%5cb",
    "/headers%0Ab",
    "/headers%00b",
    "/headers%7F",
    "/headers%252e%252e/b",
    "/headers%25",
    "/headers%zz",
    "/headers%4",
    "/headers%",
    "/headers%FFb",
    "/headers//../admin",
    "/headers/..;/admin",
    "/headers/.;x/y",
    "/headers/%2e%2e;/admin",
    "/headers-admin",
    "/headers/",
    "/headersXYZ",
    "/get",
    "headers",
    "*",
]

CLAIMS: list[Any] = [
    "L2hlYWRlcnM=",
    "L2hlYWRlcnM",
    b64path("/a~b"),
    b64path("/a~b", urlsafe=True),
    b64path("/a~b", urlsafe=True, pad=False),
    b64path("/"),
    b64path("/headers/"),
    b64path("/café"),
    None,
    123,
    True,
    ["L2hlYWRlcnM="],
    "",
    "====",
    "L2hlYWRlcnM==",
    "L2hlYWRlcnM=x",
    "L2hl YWRlcnM=",
    "L2hlYWRlcnN=",
    "L2F+Yg_",
    b64path("headers"),
    b64path("/a/../b"),
    b64path("/a/./b"),
    b64path("/.."),
    b64path("/a%2Fb"),
    b64path("/a\\b"),
    b64path("/a\nb"),
    "L2Fi/w==",
    "A" * 5000,
    b64path("/head"),
    b64path("/headers/x"),
]

now = int(NOW)
_ISS = {"iss": "https://idp.example", "aud": "api"}
_ESCAPED = '{"p\\u0061th":"L2hlYWRlcnM=","nbf":%d,"exp":%d}'
Row = tuple[str, str | None, str, tuple[str, ...]]


def _times(text: str) -> str:
    """``text`` with NBF a minute ago and EXP in ten minutes."""
    return text.replace("NBF", str(now - 60)).replace("EXP", str(now + 600))


# (name, policy, target, Authorization)

#: Tokens the local form must refer or refuse as extauthz does, beyond the table.
EXTRA: list[Row] = [
    ("alg-none-unsigned", None, "/headers", _bearer(_token().rsplit(".", 1)[0] + ".")),
    ("wrong-key", None, "/headers", _bearer(make_token(claims(NOW), key=OTHER_SECRET))),
    ("expired-in-leeway", "iss", "/x", _bearer(_token(None, exp=now - 10, **_ISS))),
    ("early-in-leeway", "iss", "/x", _bearer(_token(None, nbf=now + 10, **_ISS))),
    ("expired-past-leeway", "iss", "/x", _bearer(_token(None, exp=now - 90, **_ISS))),
    ("nbf-future", None, "/headers", _bearer(_token(nbf=now + 120))),
    ("nbf-missing-expired", None, "/headers", _bearer(_token(nbf=..., exp=now - 60))),
    ("exp-missing", None, "/headers", _bearer(_token(exp=...))),
    ("nbf-null", None, "/headers", _bearer(_token(nbf=None))),
    ("bad-b64-header", None, "/headers", _bearer("e30." + _token().split(".", 1)[1])),
    ("kid-unknown", None, "/headers", _bearer(make_token(claims(NOW), header={"kid": "k"}))),
    (
        "crit-null",
        None,
        "/headers",
        _bearer(make_token(claims(NOW), raw_header='{"alg":"HS256","crit":null}')),
    ),
    (
        "escaped-member-name",
        None,
        "/headers",
        _bearer(make_token(None, raw_payload=_ESCAPED % (now - 60, now + 600))),
    ),
    ("remove-authorization", "strip", "/headers", _bearer(_token())),
    *(
        (f"json-{name}", None, "/headers", _bearer(make_token(None, raw_payload=_times(text))))
        for name, text in {
            "leading-zero": '{"path":"L2hlYWRlcnM=","nbf":0NBF,"exp":EXP}',
            "trailing-comma": '{"path":"L2hlYWRlcnM=","nbf":NBF,"exp":EXP,}',
            "raw-tab": '{"path":"L2hlYWRlcnM=","x":"a\tb","nbf":NBF,"exp":EXP}',
            "nested-duplicate": '{"path":"L2hlYWRlcnM=","o":{"a":1,"a":2},"nbf":NBF,"exp":EXP}',
            "exponent": '{"path":"L2hlYWRlcnM=","nbf":NBF,"exp":1.9e9,"n":-0.5E+2}',
            "utf8-member": '{"path":"L2hlYWRlcnM=","é":1,"nbf":NBF,"exp":EXP}',
        }.items()
    ),
    ("segment-at-boundary", "seg", "/headers/x", _bearer(_token("/headers/"))),
    ("segment-off-boundary", "seg", "/headersx", _bearer(_token("/headers"))),
    ("prefix-off-boundary", None, "/headersx", _bearer(_token("/headers"))),
]


def _table() -> list[Row]:
    """Every row but the random ones."""
    rows: list[Row] = [
        (case.name, case.policy, case.path, case.auth)
        for case in CASES
        if case.http and case.policy not in ("allow", "deny", "nope")
    ]
    rows += EXTRA
    good = _bearer(_token())
    for target in PATH_TRICKS:
        for policy in ("hs", "seg"):
            rows.append((f"trick {target!r} {policy}", policy, target, good))
    for value in CLAIMS:
        token = _bearer(_raw_claim(value))
        for target in ("/headers", "/head", "/headers/x", "/a~b/c", "/café", "/caf%C3%A9/x"):
            rows.append((f"claim {str(value)[:20]!r} {target!r}", "seg", target, token))
            rows.append((f"claim {str(value)[:20]!r} {target!r}", None, target, token))
    return rows


def _random_rows(count: int, seed: int = 38) -> list[Row]:
    """Random paths (segments, dots, escapes, slashes, queries) against random
    claims and times, on random policies; the same rows every run."""
    rng = random.Random(seed)
    pieces = [
        "headers",
        "a",
        "H",
        ".",
        "..",
        "%2e",
        "%2E%2e",
        "%2F",
        "%25",
        "%41",
        ";x",
        "",
        "-",
        "~",
    ]
    prefixes = ["/headers", "/headers/", "/a", "/", "/head", "/a/.", "/%41"]
    rows = []
    for index in range(count):
        path = "/" + "/".join(rng.choice(pieces) for _ in range(rng.randint(0, 4)))
        if rng.random() < 0.2:
            path = "/" + path
        if rng.random() < 0.2:
            path += rng.choice(["?q=/../x", "#f", "?"])
        prefix = rng.choice(prefixes)
        claim = b64path(prefix, urlsafe=rng.random() < 0.5, pad=rng.random() < 0.5)
        time_claims: list[dict[str, Any]] = [
            {},
            {"exp": now - 5},
            {"nbf": now + 5},
            {"nbf": ...},
            {"exp": now + 1.5},
        ]
        times = rng.choice(time_claims)
        body = claims(NOW, path=None) | {"path": claim} | times
        token = make_token({k: v for k, v in body.items() if v is not ...})
        rows.append((f"random-{index}", rng.choice([None, "seg"]), path, _bearer(token)))
    return rows


def test_local_and_external_give_the_same_verdict_on_every_row(verdicts: Verdicts) -> None:
    rows = _table() + _random_rows(300)
    differing = []
    local_seen: set[str] = set()
    for name, policy, target, auth in rows:
        chosen = policy or DEFAULT
        answers = {mode: verdicts.ask(f"{chosen}.{mode}", target, auth) for mode in MODES}
        local_seen.add(answers["local"][1] or str(answers["local"][0]))
        if answers["local"] != answers["external"]:
            differing.append((name, target, answers))
    assert not differing, "\n".join(map(str, differing[:20]))
    assert len(rows) > 500
    # The table reaches both allows and local denials, not only referrals.
    assert {"200", "path_not_allowed", "bad_path", "bad_path_claim"} <= local_seen


@pytest.mark.parametrize(
    ("policy", "target", "auth", "expected"),
    [
        ("hs", "/headers/x", _bearer(_token()), (200, "")),
        ("seg", "/headersx", _bearer(_token()), (403, "path_not_allowed")),
        ("hs", "/headers%25", _bearer(_token()), (403, "bad_path")),
        ("hs", "/headers", _bearer(_raw_claim("L2hlYWRlcnN=")), (403, "bad_path_claim")),
        ("hs", "/headers", _bearer(_token(nbf=...)), (403, "bad_time_claim")),
        (
            "iss",
            "/x",
            _bearer(_token(None, iss="https://evil", aud="api")),
            (403, "issuer_mismatch"),
        ),
        ("strip", "/headers", _bearer(_token()), (200, "")),
    ],
)
def test_the_local_form_decides_without_calling_extauthz(
    verdicts: Verdicts, policy: str, target: str, auth: tuple[str, ...], expected: tuple[int, str]
) -> None:
    before = verdicts.checks()
    assert verdicts.ask(f"{policy}.local", target, auth) == expected
    assert verdicts.checks() == before
    if expected[0] == 403:  # a local denial names its decision: 32 hex digits
        assert re.fullmatch("[0-9a-f]{32}", verdicts.last_headers.get("x-decision-id", ""))


def test_a_token_the_local_form_cannot_judge_is_referred_to_extauthz(verdicts: Verdicts) -> None:
    before = verdicts.checks()
    expired = _bearer(_token(exp=now - 60))
    assert verdicts.ask("hs.local", "/headers", expired) == (403, "expired")
    assert verdicts.checks() == before + 1


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"enforcement": "external"}, "enforcement: external"),
        ({"claimsToHeaders": [{"claim": "sub", "header": "x-sub"}]}, "claimsToHeaders"),
        (
            {"jwt": {"algorithms": ["HS256"], "keys": [{"jwks": {"uri": "https://idp/jwks"}}]}},
            "JWKS URL",
        ),
        ({"jwt": {**POLICIES["hs"]["jwt"], "leewaySeconds": 1.5}}, "whole number"),
        (
            {"jwt": {"algorithms": ["HS256"], "keys": [{**_HS, "kid": "a"}, _HS]}},
            "with and without a kid",
        ),
    ],
)
def test_what_the_local_form_cannot_express_stays_external(
    change: dict[str, Any], reason: str
) -> None:
    """Each stays on ext_authz, and the route entry of ``envoyconfig`` says why."""
    spec = {**POLICIES["hs"], **change}
    route = envoy_config.ExtAuthzRoute(f"{GROUP}/settings/s", GROUP, ("ns",), "grpc://a:1", "p")
    document = envoy_config.render(
        envoy_config.EnvoyConfigInput(
            ORG_CLUSTER, "c1", (), (route,), extauthz_policies=(("p", spec),)
        )
    )
    (entry,) = document["routes"]
    assert entry["enforcement"]["path"] == "external"
    assert reason in entry["enforcement"]["reason"]
    assert "envoy.filters.http.lua" not in entry["typedPerFilterConfig"]
    assert [f["name"] for f in document["httpFilters"]] == ["envoy.filters.http.ext_authz"]


def test_claims_published_for_claim_limits_keep_the_policy_external() -> None:
    route = envoy_config.ExtAuthzRoute(f"{GROUP}/settings/s", GROUP, ("ns",), "grpc://a:1", "p")
    inp = envoy_config.EnvoyConfigInput(
        ORG_CLUSTER,
        "c1",
        (),
        (route,),
        extauthz_policies=(("p", POLICIES["hs"]),),
        published_claims={"p": ("sub",)},
    )
    (entry,) = envoy_config.render(inp)["routes"]
    assert entry["enforcement"]["path"] == "external"
