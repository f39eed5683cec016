"""Every denial says why, at both kinds of proxy: the table of denial kinds
through real Envoys (a gateway and sidecars over ADS) and the real services.

Each row is one refusal: its status, its reason header (``x-meshplane-denied``,
``KIND REASON``), its ``x-decision-id``, and exactly one decision line with that
id among every sink (the proxies' stdout access logs, extauthz's and
ratelimit's decision logs), written by the one that decided, naming the
policy, the rule and the reason.

One stack for the module: mgmt-api, redis, ratelimit, extauthz, one gateway,
and three sidecars: ``api`` (namespace ``svc``), ``ok`` (``call``, admitted by
``api``'s mode) and ``no`` (``loc``, refused by it; callee of the local rules).

- group ``g1`` selects ``svc``; its setting: mode CUSTOM admitting
  ``call/sa-ok``, and extauthz with policy ``ext`` (path claim, enforcement
  external);
- group ``g3`` selects ``loc``; its setting: local JWT rules (alice may call
  ``/local/*``), which replace any ext_authz call;
- group ``g2`` selects ``edge``; its setting calls extauthz with policy
  ``lua``, which the gateway enforces itself (its path-claim check in Lua);
- gateway routes ``svc.api`` (``/api``), ``loc.web`` (``/local``),
  ``edge.web`` (``/edge``) and ``default.open`` (``/open``, one request a
  minute).

Not rows, by design: a mode and a path-claim check inside the proxy exist at
sidecars and at gateways respectively only (a gateway's callers have no mesh
identity; a sidecar sends every ExtAuthzPolicy to the service), and sidecars
do not rate-limit.
"""

from __future__ import annotations

import base64
import json
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm

from meshplane.decision_log import DECISION_ID_HEADER, DENIED_HEADER, LOGGER
from mgmt_api.dashboards import get_dashboard
from tests.dashboards.promql import metric_names
from tests.support.mesh import MeshStack, Workload
from tests.support.processes import wait_until

#: Three sidecars, a gateway, mgmt-api and the services start in the setup.
pytestmark = pytest.mark.timeout(300)

ISSUER = "https://idp.test"
SECOND_LINE_WINDOW = 0.3
KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
#: Rows' ``policy`` for the settings of ``svc`` and ``loc`` (lines name them by FQN).
SVC_SETTING = "*/securitygroups/g1/settings/s"
LOC_SETTING = "*/securitygroups/g3/settings/s"


def _jwks() -> str:
    public = json.loads(RSAAlgorithm.to_jwk(KEY.public_key()))
    return json.dumps({"keys": [{**public, "kid": "k1", "alg": "RS256", "use": "sig"}]})


def token(sub: str, path: str) -> str:
    """An RS256 token of ``sub`` whose path claim allows ``path`` (a prefix).

    The table is built at import, which can be many minutes before a row runs
    (pytest collects every file first): the token is valid for a day."""
    now = int(time.time())
    claims = {
        "iss": ISSUER,
        "sub": sub,
        "nbf": now,
        "exp": now + 86400,
        "path": base64.b64encode(path.encode()).decode(),
    }
    return jwt.encode(claims, KEY, algorithm="RS256", headers={"kid": "k1"})


def _policy(enforcement: str | None) -> dict[str, Any]:
    policy: dict[str, Any] = {
        "jwt": {"algorithms": ["RS256"], "keys": [{"jwks": {"value": _jwks()}}]},
        "pathClaim": {"name": "path", "match": "PREFIX"},
    }
    if enforcement is not None:
        policy["enforcement"] = enforcement
    return policy


@dataclass
class Mesh:
    stack: MeshStack
    api: Workload
    ok: Workload
    no: Workload


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    stack = MeshStack(Path(tmp_path_factory.mktemp("denials")))
    try:
        api, ok, no = stack.workloads_started(
            ("api", "svc", "sa-api"), ("ok", "call", "sa-ok"), ("no", "loc", "sa-no")
        )
        workspace = stack.workspace("w", "svc", "edge", "loc")
        g1 = stack.group(workspace, "g1", "svc")
        g2 = stack.group(workspace, "g2", "edge")
        g3 = stack.group(workspace, "g3", "loc")
        stack.put(f"{g1}/extauthzpolicies", "ext", "extAuthzPolicy", _policy("external"))
        stack.put(f"{g2}/extauthzpolicies", "lua", "extAuthzPolicy", _policy(None))
        uri = stack.service_uri("extauthz")
        alice = {"jwt": {"iss": ISSUER, "sub": "alice"}}
        rules = [{"from": [alice], "to": [{"paths": ["/local/*"]}]}]
        local = {"rules": rules, "keys": {"jwks": {"value": _jwks()}}}
        stack.setting(g3, {"mode": "UNSET", "http": {"local": local}})
        external = {"uri": uri, "policy": "ext"}
        custom = {
            "mode": "CUSTOM",
            "serviceAccounts": ["call/sa-ok"],
            "http": {"external": external},
        }
        stack.setting(g1, custom)
        stack.setting(g2, {"mode": "UNSET", "http": {"external": {"uri": uri, "policy": "lua"}}})
        stack.backend("default.app")
        stack.route("svc.api", "/api", backend="default.app")
        stack.route("loc.web", "/local", backend="default.app")
        stack.route("edge.web", "/edge", backend="default.app")
        stack.route("default.open", "/open", backend="default.app")
        stack.rate_limit("default.open-limit", "open", (1, "Minute"))
        stack.gateway()
        stack.converged()
        stack.sidecars_converged()
        yield Mesh(stack, api, ok, no)
    finally:
        stack.close()


def sinks(mesh: Mesh) -> dict[str, Path]:
    """Where decision lines are written: name -> file."""
    stack = mesh.stack
    out = {
        "extauthz": stack.tmp / "extauthz.log",
        "ratelimit": stack.tmp / "ratelimit.log",
        "gateway": stack.gateways[0].envoy.stdout_path,
    }
    out.update({f"sidecar:{w.name}": w.stdout for w in stack.workloads})
    return out


def lines_with(mesh: Mesh, decision_id: str) -> list[tuple[str, dict[str, Any]]]:
    """(sink, line) of every decision line carrying ``decision_id``."""
    found = []
    for sink, path in sinks(mesh).items():
        if not path.exists():
            continue
        for text in path.read_text(errors="replace").splitlines():
            if decision_id not in text or not text.startswith("{"):
                continue
            entry = json.loads(text)
            if entry.get("logger") == LOGGER and entry.get("decision_id") == decision_id:
                found.append((sink, entry))
    return found


@dataclass(frozen=True)
class Row:
    """One denial kind at one proxy kind, and what it must say."""

    proxy: str  # gateway | sidecar
    kind: str
    request: Callable[[Mesh], httpx.Response]
    status: int
    header: str  # the reason header's value; a trailing "*" matches a prefix
    sink: str  # where its one line is
    policy: str
    rule: str
    reason: str


def _gw(path: str, bearer: str | None = None) -> Callable[[Mesh], httpx.Response]:
    return lambda m: m.stack.gateways[0].get(path, bearer)


def _sc(
    caller: str, callee: str, path: str, bearer: str | None = None
) -> Callable[[Mesh], httpx.Response]:
    return lambda m: getattr(m, caller).call(getattr(m, callee), path, bearer)


def _over_limit(m: Mesh) -> httpx.Response:
    """Requests to the one-a-minute route until one is refused (a window may turn)."""
    for _ in range(5):
        response = m.stack.gateways[0].get("/open")
        if response.status_code == 429:
            return response
    return response


ROWS = [
    Row(
        "gateway",
        "jwt",
        _gw("/local/items"),
        401,
        "jwt jwt_authn_access_denied{Jwt_is_missing}",
        "gateway",
        LOC_SETTING,
        "keys",
        "jwt_authn_access_denied{Jwt_is_missing}",
    ),
    Row(
        "gateway",
        "rules",
        _gw("/local/items", token("bob", "/local")),
        403,
        "rules no_rule_matched",
        "gateway",
        LOC_SETTING,
        "rules",
        "no_rule_matched",
    ),
    Row(
        "gateway",
        "extauthz",
        _gw("/api/other", token("alice", "/api/items")),
        403,
        "extauthz path_not_allowed",
        "extauthz",
        "*.g1.ext",
        "pathClaim",
        "path_not_allowed",
    ),
    Row(
        "gateway",
        "extauthz (inside the proxy)",
        _gw("/edge/b", token("alice", "/edge/a")),
        403,
        "extauthz path_not_allowed",
        "gateway",
        "*.g2.lua",
        "pathClaim",
        "path_not_allowed",
    ),
    Row(
        "gateway",
        "ratelimit",
        _over_limit,
        429,
        "ratelimit over_limit",
        "ratelimit",
        "*/default/open-limit",
        "*",
        "over_limit",
    ),
    Row(
        "sidecar",
        "mode",
        _sc("no", "api", "/api/items", token("alice", "/api")),
        403,
        "mode CUSTOM",
        "sidecar:api",
        SVC_SETTING,
        "mode-CUSTOM",
        "CUSTOM",
    ),
    Row(
        "sidecar",
        "jwt",
        _sc("ok", "no", "/local/items"),
        401,
        "jwt jwt_authn_access_denied{Jwt_is_missing}",
        "sidecar:no",
        LOC_SETTING,
        "keys",
        "jwt_authn_access_denied{Jwt_is_missing}",
    ),
    Row(
        "sidecar",
        "rules",
        _sc("ok", "no", "/local/items", token("bob", "/local")),
        403,
        "rules no_rule_matched",
        "sidecar:no",
        LOC_SETTING,
        "rules",
        "no_rule_matched",
    ),
    Row(
        "sidecar",
        "extauthz",
        _sc("ok", "api", "/api/other", token("alice", "/api/items")),
        403,
        "extauthz path_not_allowed",
        "extauthz",
        "*.g1.ext",
        "pathClaim",
        "path_not_allowed",
    ),
]


def _matches(expected: str, actual: str | None) -> bool:
    """Equal, or (``expected`` ending in ``*``) a prefix; ``*`` alone: any value."""
    if actual is None:
        return False
    if expected.endswith("*"):
        return actual.startswith(expected[:-1])
    return actual == expected


def test_a_request_every_check_allows_passes_both_proxies(mesh: Mesh) -> None:
    """The table's control: the same tokens on the allowed paths are served."""
    gateway = mesh.stack.gateways[0]
    for path in ("/api/items", "/local/items"):
        alice = token("alice", path)
        assert gateway.get(path, alice).status_code == 200
        assert (
            mesh.ok.call(mesh.api if path == "/api/items" else mesh.no, path, alice).status_code
            == 200
        )


@pytest.mark.parametrize("row", ROWS, ids=lambda r: f"{r.proxy}-{r.kind}")
def test_every_denial_says_why(mesh: Mesh, row: Row) -> None:
    response = row.request(mesh)
    assert response.status_code == row.status, response.text
    assert _matches(row.header, response.headers.get(DENIED_HEADER)), response.headers
    decision_id = response.headers.get(DECISION_ID_HEADER)
    assert decision_id, response.headers
    wait_until(lambda: lines_with(mesh, decision_id), 30, f"the line of {decision_id}")
    # Not a wait for a condition but the window a second line would need: proxies
    # flush their stdout and the services' writers wake every 50 ms.
    time.sleep(SECOND_LINE_WINDOW)
    found = lines_with(mesh, decision_id)
    assert len(found) == 1, found
    sink, line = found[0]
    assert sink == row.sink, found
    assert line["kind"] == row.header.split(" ", 1)[0], line
    assert line["decision"] == ("over_limit" if row.status == 429 else "deny"), line
    assert _policy_ok(row.policy, line["policy"]), line
    assert _matches(row.rule, line["rule"]), line
    assert line["reason"] == row.reason, line
    if row.sink.startswith("sidecar"):
        expected_peer = (mesh.no if row.kind == "mode" else mesh.ok).spiffe_id()
        assert line["peer"] == expected_peer, line
    if row.sink == "gateway" or row.sink.startswith("sidecar"):
        assert line["method"] == "GET" and line["path"].startswith("/"), line
        assert "authorization" not in json.dumps(line).lower()


def _policy_ok(expected: str, policy: str | None) -> bool:
    """``*x``: ends with ``x`` (a setting's FQN; ratelimit's domain,
    CLUSTER/NAMESPACE/NAME); else the policy's name."""
    if not policy:
        return False
    if expected.startswith("*"):
        return policy.endswith(expected[1:])
    return policy == expected


_SAMPLE = re.compile(r"^([a-zA-Z_:][\w:]*)(?:\{(.*)\})? (\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
_MATCHER = re.compile(r'(\w+)(=~|!~|!=|=)"([^"]*)"')
Sample = tuple[str, dict[str, str], float]


def scrape(text: str) -> list[Sample]:
    """The samples of a Prometheus text page (Envoy's ``/stats/prometheus``)."""
    out = []
    for line in text.splitlines():
        found = _SAMPLE.match(line)
        if found and not line.startswith("#"):
            labels = dict(_LABEL.findall(found.group(2) or ""))
            out.append((found.group(1), labels, float(found.group(3))))
    return out


def counted(samples: list[Sample], expr: str) -> float:
    """What a panel's ``sum(rate(METRIC{...}))`` sums, as raw counters: the samples
    of its one metric that meet its equality matchers (``label=""``: no such label;
    ``job`` and ``instance`` are Prometheus's, not Envoy's)."""
    (metric,) = metric_names(expr)
    wanted = {
        k: v for k, op, v in _MATCHER.findall(expr) if op == "=" and k not in ("job", "instance")
    }
    return sum(
        value
        for name, labels, value in samples
        if name == metric and all(labels.get(k, "") == v for k, v in wanted.items())
    )


@pytest.mark.parametrize(
    ("title", "proxy"),
    [
        ("Denials/s by reason at gateways", "gateway"),
        ("Denials/s by reason at sidecars", "sidecar"),
    ],
)
def test_the_dashboard_counts_each_denial_kind_by_envoys_own_names(
    mesh: Mesh, title: str, proxy: str
) -> None:
    """Every series of the gateway dashboard's denial panel is a counter real Envoys
    export (their ``/stats/prometheus``), and counts its kind's refusals."""
    for row in ROWS:
        if row.proxy == proxy:
            row.request(mesh)  # each kind at least once, whatever ran before
    if proxy == "gateway":
        pages = [mesh.stack.gateways[0].envoy.admin("GET", "/stats/prometheus").text]
    else:
        pages = [w.admin("GET", "/stats/prometheus").text for w in mesh.stack.workloads]
    samples = [sample for page in pages for sample in scrape(page)]
    model = json.loads(get_dashboard("gateway") or b"{}")
    (panel,) = [p for p in model["panels"] if p["title"] == title]
    for target in panel["targets"]:
        assert counted(samples, target["expr"]) > 0, (target["legendFormat"], target["expr"])
