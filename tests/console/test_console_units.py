"""The console's pure parts, table-tested: cookies and CSRF, forms, status verdicts,
conflict diffs, secret redaction, and the vendored htmx pin."""

from __future__ import annotations

import datetime as dt
import hashlib
from pathlib import Path
from typing import Any

import pytest

from mgmt_api.console import (
    conflict,
    diagnostics,
    forms,
    mesh,
    navigation,
    session,
    status,
    traffic,
)
from mgmt_api.console.forms import FieldDef
from mgmt_api.console.policy_kinds import POLICY_PAGES
from mgmt_api.console.redact import HIDDEN, redact_secrets


@pytest.mark.parametrize(
    ("scheme", "host", "public_url", "secure"),
    [
        ("http", "127.0.0.1", None, False),  # scripts/run
        ("http", "::1", None, False),
        ("http", "10.0.0.5", None, True),  # plain HTTP off loopback: the browser won't send it
        ("https", "127.0.0.1", None, True),
        ("http", "127.0.0.1", "https://mesh.example.com", True),  # TLS ends at a proxy
    ],
)
def test_cookie_is_secure_except_plain_http_on_loopback(
    scheme: str, host: str, public_url: str | None, secure: bool
) -> None:
    policy = session.cookie_policy(scheme, host, public_url)
    assert policy.secure is secure
    assert policy.name("meshplane-console") == (
        "__Secure-meshplane-console" if secure else "meshplane-console"
    )


def test_csrf_tokens_are_bound_to_the_session_and_the_server_secret() -> None:
    key = session.csrf_key("server-secret")
    token = session.csrf_token(key, "session-a")
    assert session.csrf_ok(key, "session-a", token)
    assert not session.csrf_ok(key, "session-b", token)
    assert not session.csrf_ok(session.csrf_key("other-secret"), "session-a", token)
    assert not session.csrf_ok(key, "session-a", None)
    assert not session.csrf_ok(key, "", token)
    assert session.nonce_ok("n", "n") and not session.nonce_ok("n", "m")
    assert not session.nonce_ok(None, "n")


@pytest.mark.parametrize(
    ("value", "safe"),
    [
        ("/ui/o/web?q=a", "/ui/o/web?q=a"),
        (None, "/ui/"),
        ("https://evil.example/ui/", "/ui/"),
        ("//evil.example/ui/", "/ui/"),
        ("/v2/organizations", "/ui/"),
        ("/ui/\r\nSet-Cookie: x", "/ui/"),
    ],
)
def test_the_post_login_target_stays_in_the_console(value: str | None, safe: str) -> None:
    assert session.safe_next(value) == safe


FIELDS = [
    FieldDef("spec.targetRef.name", "name"),
    FieldDef("spec.rateLimit.global.rules[0].limit.requests", "n", "number"),
    FieldDef("spec.rateLimit.global.rules[0].clientSelectors", "sel", "json"),
    FieldDef("spec.rateLimit.global.shadowMode", "shadow", "checkbox"),
    FieldDef("jwt.algorithms", "alg", "csv"),
]


def test_forms_build_the_body_from_field_paths_and_keep_what_they_do_not_show() -> None:
    base: dict[str, Any] = {"spec": {"targetRef": {"kind": "HTTPRoute", "name": "old"}, "keep": 1}}
    body, errors = forms.to_body(
        FIELDS,
        {
            "spec.targetRef.name": "web",
            "spec.rateLimit.global.rules[0].limit.requests": "5",
            "spec.rateLimit.global.rules[0].clientSelectors": "",
            "jwt.algorithms": "HS256, RS256",
        },
        base,
    )
    assert errors == {}
    assert forms.prune(body) == {
        "spec": {
            "targetRef": {"kind": "HTTPRoute", "name": "web"},
            "keep": 1,
            "rateLimit": {"global": {"rules": [{"limit": {"requests": 5}}]}},
        },
        "jwt": {"algorithms": ["HS256", "RS256"]},
    }
    assert base["spec"]["targetRef"]["name"] == "old"  # not modified in place


@pytest.mark.parametrize(
    ("text", "value", "error"),
    [
        ("12", 12, None),
        ("ten", "ten", None),  # left for the API to name
        ("", None, None),
    ],
)
def test_numbers_are_parsed_or_left_for_the_api(text: str, value: Any, error: str | None) -> None:
    assert forms.parse_value(FieldDef("n", "n", "number"), text) == (value, error)


def test_invalid_json_is_an_error_beside_its_field() -> None:
    _, errors = forms.to_body(FIELDS, {"spec.rateLimit.global.rules[0].clientSelectors": "[{"})
    assert "not valid JSON" in errors["spec.rateLimit.global.rules[0].clientSelectors"]


@pytest.mark.parametrize(
    ("field", "placed"),
    [
        (
            "spec.rateLimit.global.rules[0].limit.requests",
            "spec.rateLimit.global.rules[0].limit.requests",
        ),
        (
            "spec.rateLimit.global.rules[0].clientSelectors[1].headers[0].value",
            "spec.rateLimit.global.rules[0].clientSelectors",
        ),
        ("spec.targetRef.namespace", None),
        ("spec.targetRef.nameX", None),  # a prefix only at a path boundary
        ("metadata", None),
    ],
)
def test_api_errors_land_beside_the_longest_matching_input(field: str, placed: str | None) -> None:
    assert forms.place_error(field, [f.name for f in FIELDS]) == placed


def test_create_errors_are_relative_to_the_object() -> None:
    name = "backendTrafficPolicy.spec.rateLimit.type"
    assert forms.relative_field(name, "backendTrafficPolicy") == "spec.rateLimit.type"
    assert (
        forms.error_message(f"{name}: Input should be 'Global'", name) == "Input should be 'Global'"
    )


def test_the_rate_limit_form_has_a_row_per_rule_and_one_to_add() -> None:
    obj: dict[str, Any] = {"spec": {"rateLimit": {"global": {"rules": [{}, {}]}}}}
    groups = {f.group for f in POLICY_PAGES["traffic"].fields(obj) if f.group}
    assert groups == {"Rule 1", "Rule 2", "Add a rule"}


def _instance(**kw: Any) -> dict[str, Any]:
    base = {
        "kind": "ratelimit",
        "instance": "i1",
        "connected": True,
        "stale": False,
        "appliedVersion": "v2",
        "lastResult": "ACK",
        "upToDate": True,
        "lastError": "",
        "lastContactTime": "2026-11-26T17:05:09.250000Z",
    }
    return {**base, **kw}


def _gateway(**kw: Any) -> dict[str, Any]:
    return _instance(**{"kind": "gateway", "instance": "gw-1", "appliedVersion": "g2", **kw})


@pytest.mark.parametrize(
    ("instances", "tone", "text"),
    [
        ([], "none", "No instance has subscribed yet"),
        ([_instance(), _instance(instance="i2")], "ok", "Applied on all 2 instances"),
        ([_instance(), _instance(upToDate=False, appliedVersion="v1")], "wait", "Applying: 1 of 2"),
        (
            [_instance(lastResult="NACK", upToDate=False, lastError="bad")],
            "bad",
            "Not applied everywhere: 1 rejected of 1",
        ),
        ([_instance(stale=True)], "bad", "Not applied everywhere: 1 not reachable of 1"),
        ([_instance(connected=False)], "bad", "Not applied everywhere: 1 not reachable"),
    ],
)
def test_status_verdicts(instances: list[dict[str, Any]], tone: str, text: str) -> None:
    verdict = status.cluster_verdict(
        {"desiredVersions": {"ratelimit": "v2"}, "instances": instances}
    )
    assert verdict.tone == tone
    assert verdict.text.startswith(text)


GHOST = {"message": "BackendTrafficPolicy p targets HTTPRoute default/ghost, which does not exist"}


@pytest.mark.parametrize(
    ("instances", "warnings", "tone", "text"),
    [
        ([_instance()], [GHOST], "warn", "Applied with warnings: BackendTrafficPolicy p targets"),
        ([_instance()], [GHOST, GHOST], "warn", "Applied with warnings: "),
        ([_instance(stale=True)], [GHOST], "bad", "Not applied everywhere"),
        ([], [GHOST], "none", "No instance has subscribed yet"),
    ],
)
def test_warnings_turn_applied_amber(
    instances: list[dict[str, Any]], warnings: list[dict[str, str]], tone: str, text: str
) -> None:
    """A reference to a missing object is never "Applied": amber, naming it."""
    verdict = status.cluster_verdict(
        {"desiredVersions": {"ratelimit": "v2"}, "instances": instances, "warnings": warnings}
    )
    assert (verdict.tone, verdict.text[: len(text)]) == (tone, text)
    assert verdict.warnings == tuple(w["message"] for w in warnings)
    assert ("and 1 more" in verdict.text) is (len(warnings) == 2 and tone == "warn")


# A BackendTrafficPolicy's status lists every instance that carries it: the
# ratelimit instances and the gateways, each against its own kind's version.
TRAFFIC_DESIRED = {"ratelimit": "v2", "gateway": "g2"}


@pytest.mark.parametrize(
    ("instances", "tone", "text", "states"),
    [
        (
            [_gateway(), _instance()],
            "ok",
            "Applied on all 2 instances",
            ["Applied (ACK)", "Applied (ACK)"],
        ),
        (
            [
                _gateway(lastResult="NACK", upToDate=False, lastError="cluster switch refused"),
                _instance(),
            ],
            "bad",
            "Not applied everywhere: 1 rejected of 2 instances",
            ["Rejected (NACK)", "Applied (ACK)"],
        ),
        (
            [_gateway(upToDate=False, appliedVersion="g1"), _instance()],
            "wait",
            "Applying: 1 of 2 instances up to date",
            ["Applying…", "Applied (ACK)"],
        ),
        (
            [_gateway(stale=True), _instance()],
            "bad",
            "Not applied everywhere: 1 not reachable of 2 instances",
            ["Stale: not heard from", "Applied (ACK)"],
        ),
        (
            [_gateway(connected=False), _instance()],
            "bad",
            "Not applied everywhere: 1 not reachable of 2 instances",
            ["Disconnected", "Applied (ACK)"],
        ),
        # A NACK of an older version, since superseded by an ACKed current one, is green.
        ([_gateway(lastResult="NACK", upToDate=True)], "ok", "Applied on all 1 instances", None),
    ],
)
def test_a_policy_verdict_counts_the_gateways_that_carry_it(
    instances: list[dict[str, Any]], tone: str, text: str, states: list[str] | None
) -> None:
    view = {"desiredVersions": TRAFFIC_DESIRED, "instances": instances}
    verdict = status.traffic_verdict(view)
    assert (verdict.tone, verdict.text) == (tone, text)
    if states is not None:
        assert [r.state for r in verdict.rows] == states


def test_each_row_wants_its_own_kinds_version() -> None:
    view = {"desiredVersions": {"ratelimit": "r" * 20, "gateway": "g" * 20}}
    verdict = status.traffic_verdict({**view, "instances": [_gateway(), _instance()]})
    assert [(r.kind, r.desired) for r in verdict.rows] == [
        ("gateway", "g" * 12),
        ("ratelimit", "r" * 12),
    ]


@pytest.mark.parametrize(
    ("stamp", "shown"),
    [
        ("2026-11-26T17:05:09.250000Z", "17:05:09 UTC"),
        ("2026-11-26T18:05:09+01:00", "17:05:09 UTC"),
        ("", "never"),
        (None, "never"),
        (1790000000.1, "never"),  # the old epoch number is not a time this page reads
        ("yesterday", "unknown"),
    ],
)
def test_last_contact_is_read_as_rfc3339(stamp: object, shown: str) -> None:
    assert status.clock_time(stamp) == shown


def test_compile_errors_win_and_group_views_name_the_cluster() -> None:
    verdict = status.group_verdict(
        {
            "clusters": [
                {
                    "cluster": "organizations/o/clusters/c1",
                    "desiredVersions": {"extauthz": "v2", "gateway": "g2"},
                    "instances": [_instance(kind="extauthz"), _gateway(upToDate=True)],
                    "compileErrors": {"extauthz": "boom"},
                },
                {
                    "cluster": "organizations/o/clusters/c2",
                    "desiredVersions": {"extauthz": "v2", "gateway": "g2"},
                    "instances": [_gateway(lastResult="NACK", upToDate=False)],
                },
            ]
        }
    )
    assert verdict.tone == "bad" and verdict.compile_errors == ("c1: extauthz: boom",)
    assert [(r.cluster, r.kind, r.tone) for r in verdict.rows] == [
        ("c1", "extauthz", "ok"),
        ("c1", "gateway", "ok"),
        ("c2", "gateway", "bad"),
    ]


def test_the_conflict_diff_shows_theirs_as_removed_and_yours_as_added() -> None:
    theirs = {"etag": "b", "spec": {"limit": 20}}
    mine = {"spec": {"limit": 30}}
    lines = conflict.diff(theirs, mine)
    assert [line.text for line in lines if line.kind == "del"] == ["-  limit: 20"]
    assert [line.text for line in lines if line.kind == "add"] == ["+  limit: 30"]


def test_install_template_secrets_never_reach_a_page() -> None:
    template = {
        "helm": {"secrets": {"clusterServiceAccount": {"jwk": "K", "keys": ["a"]}}},
        "spec": {"url": "https://x"},
    }
    shown = redact_secrets(template)
    assert shown["helm"]["secrets"]["clusterServiceAccount"] == {"jwk": HIDDEN, "keys": [HIDDEN]}
    assert shown["spec"] == {"url": "https://x"}


def test_the_vendored_htmx_is_the_pinned_release() -> None:
    vendored = Path("mgmt_api/console/static/vendor/htmx-2.0.11.min.js").read_bytes()
    assert hashlib.sha256(vendored).hexdigest() == (
        "d6fdc75f204e6bdefa99b69bf1e6d4ac69b8a364f77929f45c13476b4000f717"
    )


# --- navigation, traffic summaries, diagnostics (pure) ------------------------------


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({}, [("Organizations", "/ui/"), ("o", "")]),
        ({"here": "Audit log"}, [("Organizations", "/ui/"), ("o", "/ui/o/o"), ("Audit log", "")]),
        (
            {"cluster": "c"},
            [("Organizations", "/ui/"), ("o", "/ui/o/o"), ("cluster c", "")],
        ),
        (
            {"tenant": "t", "workspace": "w", "group": "g", "here": "new"},
            [
                ("Organizations", "/ui/"),
                ("o", "/ui/o/o"),
                ("tenant t", "/ui/o/o/t/t"),
                ("workspace w", "/ui/o/o/t/t/w/w"),
                ("security group g", "/ui/o/o/t/t/w/w/g/g"),
                ("new", ""),
            ],
        ),
        (
            {"tenant": "t", "workspace": "w"},
            [
                ("Organizations", "/ui/"),
                ("o", "/ui/o/o"),
                ("tenant t", "/ui/o/o/t/t"),
                ("workspace w", ""),
            ],
        ),
    ],
)
def test_trail_walks_every_level(kwargs: dict[str, str], expected: list[tuple[str, str]]) -> None:
    assert navigation.trail("o", **kwargs) == expected


@pytest.mark.parametrize(
    ("route", "summary"),
    [
        ({"spec": {"rules": [{"backendRefs": [{"name": "b"}]}]}}, "/* → b"),
        (
            {
                "spec": {
                    "hostnames": ["a.example"],
                    "rules": [
                        {
                            "matches": [
                                {"path": {"type": "PathPrefix", "value": "/api/"}},
                                {"path": {"type": "Exact", "value": "/x"}},
                            ],
                            "backendRefs": [{"name": "b1"}, {"name": "b2"}],
                        },
                        {"matches": [{"path": {"value": "/"}}]},
                    ],
                }
            },
            "a.example: /api/* /x → b1, b2; /* → no backend",
        ),
        ({}, ""),
    ],
)
def test_route_summary(route: dict[str, Any], summary: str) -> None:
    assert traffic.route_summary(route) == summary


@pytest.mark.parametrize(
    ("backend", "summary"),
    [
        ({"spec": {"endpoints": [{"ip": {"address": "10.0.0.1", "port": 80}}]}}, "10.0.0.1:80"),
        ({"spec": {"endpoints": [{"ip": {"address": "::1", "port": 80}}]}}, "[::1]:80"),
        (
            {"spec": {"endpoints": [{"fqdn": {"hostname": "a.svc", "port": 8080}}, {}]}},
            "a.svc:8080, ?:None",
        ),
        ({"spec": {}}, "no endpoint"),
    ],
)
def test_backend_summary(backend: dict[str, Any], summary: str) -> None:
    assert traffic.backend_summary(backend) == summary


@pytest.mark.parametrize(
    ("view", "query", "body"),
    [
        ("stats", {"namespace": "ns"}, None),
        ("stats", {"namespace": "ns", "workload": "web"}, {"namespace": "ns", "workload": "web"}),
        (
            "stats",
            {"namespace": " ns ", "workload": "web", "instance": "w-1", "filter": "^http"},
            {"namespace": "ns", "workload": "web", "instance": "w-1", "filter": "^http"},
        ),
        (
            "config",
            {"namespace": "ns", "workload": "web", "filter": "ignored", "resource": "r"},
            {"namespace": "ns", "workload": "web", "resource": "r"},
        ),
        (
            "loggers",
            {"namespace": "ns", "workload": "web" * 200},
            {"namespace": "ns", "workload": ("web" * 200)[:256]},
        ),
    ],
)
def test_diagnostics_request_bodies(
    view: str, query: dict[str, str], body: dict[str, Any] | None
) -> None:
    assert diagnostics.request_body(diagnostics.VIEWS[view], query) == body


@pytest.mark.parametrize(
    ("form", "body"),
    [
        (
            {"namespace": "n", "workload": "w", "level": "debug"},
            {"namespace": "n", "workload": "w", "level": "debug"},
        ),
        (
            {"namespace": "n", "workload": "w", "level": "trace", "logger": "upstream"},
            {"namespace": "n", "workload": "w", "loggers": {"upstream": "trace"}},
        ),
        ({"namespace": "n", "workload": "w", "level": "loud"}, None),
        ({"namespace": "n", "level": "debug"}, None),
    ],
)
def test_set_levels_body(form: dict[str, str], body: dict[str, Any] | None) -> None:
    assert diagnostics.set_levels_body(form) == body


# --- the mesh: workloads, callers, the diagnostics picker, local rules (pure) -------

NOON = dt.datetime(2026, 11, 29, 12, 0, tzinfo=dt.UTC)


@pytest.mark.parametrize(
    ("stamp", "words", "tone"),
    [
        ("2026-11-30T11:00:00Z", "in 23h (2026-11-30 11:00 UTC)", "ok"),
        ("2026-11-29T12:30:00Z", "in 30m (2026-11-29 12:30 UTC)", "wait"),
        ("2026-11-29T11:00:00Z", "expired 1h ago", "bad"),
        (None, "no certificate recorded", "none"),
    ],
)
def test_certificate_expiry_words(stamp: Any, words: str, tone: str) -> None:
    assert mesh.expiry(stamp, NOON) == (words, tone)


def test_workload_rows_read_the_servers_view() -> None:
    view = {
        "desiredVersion": "v2",
        "workloads": [
            {
                "namespace": "shop",
                "service": "web",
                "instance": "shop-web",
                "spiffeId": "spiffe://td/ns/shop/sa/web",
                "certificate": {"notAfter": "2026-11-30T12:00:00Z"},
                "authorization": {"setting": "x/s", "mode": "NAMESPACE", "principals": ["p*"]},
                "config": _instance(kind="sidecar", instance="shop-web"),
            },
            {"namespace": "billing", "service": "pay", "instance": "billing-pay"},
        ],
    }
    web, pay = mesh.workload_rows(view, NOON)
    assert (web.expires, web.mode, web.callers) == (
        "in 1d (2026-11-30 12:00 UTC)",
        "NAMESPACE",
        ("p*",),
    )
    assert web.config is not None and web.config.state == "Applied (ACK)"
    assert web.diagnostics == "sidecar:shop/web/shop-web"
    assert pay.config is None and pay.expiry_tone == "none"
    assert pay.callers == ("anyone: no SecuritySetting selects the namespace",)


def test_the_diagnostics_picker_lists_agent_proxies_and_every_sidecar() -> None:
    cluster = {
        "namespaces": [
            {"name": "edge", "services": [{"name": "gw", "workloads": [{"name": "gw-1"}]}]},
            {"name": "shop", "services": [{"name": "web", "workloads": [{"name": "shop-web"}]}]},
        ]
    }
    view = {
        "workloads": [
            {"namespace": "shop", "service": "web", "instance": "shop-web"},
            {"namespace": "billing", "service": "pay", "instance": "billing-pay"},
        ]
    }
    choices = mesh.proxies(cluster, view)
    assert [(p.label, p.served) for p in choices] == [
        ("proxy edge/gw (gw-1)", True),
        ("sidecar shop/web (shop-web)", True),
        ("sidecar billing/pay (billing-pay): diagnostics not served", False),
    ]
    assert mesh.chosen("sidecar:shop/web/shop-web", choices) == choices[1]
    assert mesh.chosen("proxy:shop/web/anything", choices) is None  # never free-form
    assert mesh.proxies({}, None) == []


def test_local_jwt_rules_for_people() -> None:
    setting = {
        "authorization": {
            "http": {
                "local": {
                    "rules": [
                        {"from": [{"jwt": {"iss": "https://idp", "other": {"team": "a"}}}]},
                        {"from": [{"jwt": {}}], "to": [{"paths": ["/x/*"]}, {"methods": ["GET"]}]},
                    ],
                    "keys": {"jwks": {"uri": "https://idp/jwks"}},
                }
            }
        }
    }
    assert mesh.local_rules(setting) == [
        ("iss=https://idp, team=a", "anything"),
        ("any valid token", "any method /x/* or GET any path"),
    ]
    assert mesh.local_keys(setting) == "remote JWKS https://idp/jwks"
    assert mesh.local_rules(None) == [] and mesh.local_keys({}) == ""


def test_diagnostics_answers_become_tables() -> None:
    stats = {"instances": [
        {"namespace": "n", "workload": "w", "instance": "i", "stats": [{"name": "a", "value": 1}]},
        {"namespace": "n", "workload": "w", "instance": "j", "error": {"message": "down"}},
    ]}  # fmt: skip
    ok_one, failed = diagnostics.readable(diagnostics.VIEWS["stats"], stats)
    assert ok_one.title == "n/w (i)" and ok_one.tables[0].rows == (("a", "1"),)
    assert failed.error == "down"
    host = {"address": {"socket_address": {"address": "10.0.0.1", "port_value": 80}}}
    clusters = {"instances": [{"clusterStats": {"cluster_statuses": [
        {"name": "up", "host_statuses": [host]}, {"name": "none"},
    ]}}]}  # fmt: skip
    (answer,) = diagnostics.readable(diagnostics.VIEWS["clusters"], clusters)
    assert answer.tables[0].rows == (("up", "10.0.0.1:80", "HEALTHY"), ("none", "—", "no endpoint"))
    dump = {"instances": [{"configDump": {"configs": [{"@type": "x.v3.ListenersConfigDump"}]},
                           "redactedFields": 2}]}  # fmt: skip
    (answer,) = diagnostics.readable(diagnostics.VIEWS["config"], dump)
    assert answer.sections[0][0] == "ListenersConfigDump"
    assert answer.notes == ("2 secret values were redacted by the agent.",)
    many = {"instances": [{"stats": [{"name": str(i), "value": i} for i in range(600)]}]}
    (answer,) = diagnostics.readable(diagnostics.VIEWS["stats"], many)
    assert (len(answer.tables[0].rows), answer.tables[0].more) == (500, 100)
