"""The gateway knobs of a cluster, from its stored spec to the rendered filters (pure).

Table tests of :func:`envoy_config.gateway_settings` (defaults, each field,
and the stored values it refuses), then of the filters and document it
renders: parsed into Envoy's protos, and accepted by ``envoy --mode validate``.
Nothing here reads a clock.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, cast

import pytest
from envoy.config.cluster.v3 import circuit_breaker_pb2
from envoy.extensions.filters.http.ext_authz.v3 import ext_authz_pb2
from envoy.extensions.filters.http.ratelimit.v3 import rate_limit_pb2
from envoy.service.auth.v3 import external_auth_pb2

from extauthz.contract import POLICY_CONTEXT_KEY
from extauthz.grpc_api import attributes_from_check
from mgmt_api.compiler import envoy_config
from mgmt_api.compiler.envoy_config import GatewayKnobs, GatewaySettings, gateway_settings
from mgmt_api.compiler.traffic_policy import BackendTrafficPolicy
from tests.support.envoy import assert_envoy_accepts
from tests.support.envoy_protos import parse, parse_typed

DEFAULTS = GatewaySettings()


def test_defaults_are_explicit_and_closed_for_authorization() -> None:
    assert asdict(DEFAULTS) == {
        "ratelimit_timeout": "0.100s",
        "ratelimit_fail_closed": False,
        "ext_authz_timeout": "0.200s",
        "ext_authz_failure_mode_allow": False,
        "circuit_breakers": None,
        "tracing": None,  # Envoy's tracer: off unless the Cluster sets tracing
    }
    assert gateway_settings({}) == DEFAULTS


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"rateLimit": {"timeout": "0.25s"}}, GatewaySettings(ratelimit_timeout="0.250s")),
        ({"rateLimit": {"timeout": "0.001s"}}, GatewaySettings(ratelimit_timeout="0.001s")),
        ({"rateLimit": {"timeout": "60s"}}, GatewaySettings(ratelimit_timeout="60.000s")),
        ({"rateLimit": {"failureMode": "deny"}}, GatewaySettings(ratelimit_fail_closed=True)),
        ({"rateLimit": {"failureMode": "allow"}}, DEFAULTS),
        ({"rateLimit": {"failureMode": "unavailable"}}, DEFAULTS),
        ({"rateLimit": {"redis": {"disabled": True}}}, DEFAULTS),
        ({"extAuthz": {"timeout": "1.5s"}}, GatewaySettings(ext_authz_timeout="1.500s")),
        (
            {"extAuthz": {"failureModeAllow": True}},
            GatewaySettings(ext_authz_failure_mode_allow=True),
        ),
        ({"extAuthz": {"failureModeAllow": False}}, DEFAULTS),
        ({"circuitBreakers": {}}, DEFAULTS),
        (
            {"circuitBreakers": {"maxRequests": 1}},
            GatewaySettings(
                circuit_breakers={"thresholds": [{"priority": "DEFAULT", "maxRequests": 1}]}
            ),
        ),
        (
            {
                "circuitBreakers": {
                    "maxRetries": 2,
                    "maxRequests": 3,
                    "maxPendingRequests": 4,
                    "maxConnections": 2**31 - 1,
                }
            },
            GatewaySettings(
                circuit_breakers={
                    "thresholds": [
                        {
                            "priority": "DEFAULT",
                            "maxConnections": 2**31 - 1,
                            "maxPendingRequests": 4,
                            "maxRequests": 3,
                            "maxRetries": 2,
                        }
                    ]
                }
            ),
        ),
        ({"network": "n1", "tokenTtl": "600s"}, DEFAULTS),  # other settings: not read
    ],
)
def test_stored_spec_to_settings(spec: GatewayKnobs, expected: GatewaySettings) -> None:
    assert gateway_settings(spec) == expected


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"rateLimit": {"timeout": "100ms"}}, "rateLimit.timeout"),  # not the stored form
        ({"rateLimit": {"timeout": 0.1}}, "rateLimit.timeout"),
        ({"rateLimit": {"timeout": "0s"}}, "rateLimit.timeout"),
        ({"rateLimit": {"timeout": "61s"}}, "rateLimit.timeout"),
        ({"extAuthz": {"timeout": "0.0001s"}}, "extAuthz.timeout"),
        ({"extAuthz": {"failureModeAllow": "true"}}, "extAuthz.failureModeAllow"),
        ({"circuitBreakers": {"maxConnections": 0}}, "circuitBreakers.maxConnections"),
        ({"circuitBreakers": {"maxRetries": 2**31}}, "circuitBreakers.maxRetries"),
        ({"circuitBreakers": {"maxRequests": True}}, "circuitBreakers.maxRequests"),
        ({"circuitBreakers": {"maxPendingRequests": "5"}}, "circuitBreakers.maxPendingRequests"),
    ],
)
def test_a_spec_written_around_the_api_is_refused_naming_the_field(
    spec: dict[str, Any], field: str
) -> None:
    # Stored JSON written around the API: typed as the API writes it, as the enforcement
    # service types what it reads from the store (a cast there too).
    with pytest.raises(ValueError, match=f"^{field}: "):
        gateway_settings(cast(GatewayKnobs, spec))


CUSTOM = gateway_settings(
    {
        "rateLimit": {"timeout": "0.25s", "failureMode": "deny"},
        "extAuthz": {"timeout": "0.05s", "failureModeAllow": True},
        "circuitBreakers": {"maxPendingRequests": 1, "maxRequests": 2},
    }
)


@pytest.mark.parametrize("settings", [DEFAULTS, CUSTOM], ids=["defaults", "custom"])
def test_filters_render_the_settings(settings: GatewaySettings) -> None:
    rl = parse_typed(
        envoy_config.ratelimit_filter("east", settings)["typedConfig"], rate_limit_pb2.RateLimit()
    )
    assert rl.timeout.ToMilliseconds() == (250 if settings is CUSTOM else 100)
    assert rl.failure_mode_deny is (settings is CUSTOM)
    ext = parse_typed(
        envoy_config.ext_authz_filter(
            "envoy.filters.http.ext_authz", "extauthz", settings, sorted(envoy_config.CHECK_HEADERS)
        )["typedConfig"],
        ext_authz_pb2.ExtAuthz(),
    )
    assert ext.grpc_service.timeout.ToMilliseconds() == (50 if settings is CUSTOM else 200)
    assert ext.failure_mode_allow is (settings is CUSTOM)
    assert ext.status_on_error.code == 503  # an outage is never a 403
    assert [m.exact for m in ext.allowed_headers.patterns] == sorted(envoy_config.CHECK_HEADERS)
    assert ext.grpc_service.envoy_grpc.skip_envoy_headers
    assert rl.rate_limit_service.grpc_service.envoy_grpc.skip_envoy_headers


def _check(headers: dict[str, str]) -> external_auth_pb2.CheckRequest:
    request = external_auth_pb2.CheckRequest()
    http = request.attributes.request.http
    http.method, http.path = "GET", "/shop/cart"
    http.headers.update(headers)
    request.attributes.context_extensions[POLICY_CONTEXT_KEY] = "t.w.g.jwt"
    return request


def test_a_check_with_only_the_check_headers_reads_the_same_to_extauthz() -> None:
    """What extauthz takes from a Check (token, path, policy; the trace context its
    decision log keeps) is the same with every request header or only CHECK_HEADERS."""
    every = {
        ":authority": "shop.example",
        ":path": "/shop/cart",
        ":method": "GET",
        "authorization": "Bearer a.b.c",
        "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "tracestate": "vendor=1",
        "user-agent": "curl/8",
        "x-request-id": "0e0b5d4c",
        "x-forwarded-proto": "http",
    }
    narrowed = {k: v for k, v in every.items() if k in envoy_config.CHECK_HEADERS}
    assert set(narrowed) == set(envoy_config.CHECK_HEADERS)
    full, narrow = _check(every), _check(narrowed)
    assert attributes_from_check(full) == attributes_from_check(narrow)
    for header in ("traceparent", "tracestate"):
        assert full.attributes.request.http.headers.get(header) == (
            narrow.attributes.request.http.headers.get(header)
        )


def _route(policy: str | None, include: tuple[str, ...] = ()) -> envoy_config.ExtAuthzRoute:
    return envoy_config.ExtAuthzRoute(
        "s", "g", ("*",), "grpc://az:9191", policy, include_headers=include
    )


CHECK = sorted(envoy_config.CHECK_HEADERS)


@pytest.mark.parametrize(
    ("routes", "expected"),
    [
        # meshplane's extauthz (a policy named): only what it reads.
        ([_route("w.g.jwt")], CHECK),
        ([_route("w.g.jwt", ("X-Api-Key", "authorization"))], [*CHECK, "x-api-key"]),
        # Headers listed for a server of one's own: those and CHECK_HEADERS.
        ([_route(None, ("x-user",))], [*CHECK, "x-user"]),
        # Neither: the server may be anyone's, so every header (None).
        ([_route(None)], None),
        ([_route("w.g.jwt"), _route(None)], None),
        ([_route("w.g.jwt", ("x-a",)), _route(None, ("x-b",))], [*CHECK, "x-a", "x-b"]),
    ],
)
def test_a_servers_check_headers(
    routes: list[envoy_config.ExtAuthzRoute], expected: list[str] | None
) -> None:
    assert envoy_config.server_check_headers(routes) == expected


def _document(settings: GatewaySettings) -> dict[str, Any]:
    policy = BackendTrafficPolicy.model_validate(
        {
            "apiVersion": "gateway.envoyproxy.io/v1alpha1",
            "kind": "BackendTrafficPolicy",
            "metadata": {"namespace": "shop", "name": "limits"},
            "spec": {
                "targetRef": {"kind": "HTTPRoute", "name": "web"},
                "rateLimit": {
                    "type": "Global",
                    "global": {"rules": [{"limit": {"requests": 3, "unit": "Minute"}}]},
                },
            },
        }
    )
    authz = envoy_config.ExtAuthzRoute("s/a", "g/a", ("shop",), "grpc://authz:9191", "w.a.jwt")
    return envoy_config.render(
        envoy_config.EnvoyConfigInput(
            "organizations/o/clusters/east",
            "east",
            (("p/limits", policy),),
            (authz,),
            gateway=settings,
        )
    )


@pytest.mark.parametrize("settings", [DEFAULTS, CUSTOM], ids=["defaults", "custom"])
def test_the_document_carries_the_circuit_breakers_and_envoy_accepts_it(
    settings: GatewaySettings,
) -> None:
    document = _document(settings)
    assert document["circuitBreakers"] == settings.circuit_breakers
    if settings is CUSTOM:
        breakers = parse(document["circuitBreakers"], circuit_breaker_pb2.CircuitBreakers())
        (thresholds,) = breakers.thresholds
        assert (thresholds.max_pending_requests.value, thresholds.max_requests.value) == (1, 2)
        assert not thresholds.HasField("max_connections")  # Envoy's default stays
    assert_envoy_accepts(document)


def test_envoy_validation_does_catch_a_bad_render() -> None:
    """The check every render goes through is not vacuous."""
    document = _document(DEFAULTS)
    document["httpFilters"][1]["typedConfig"]["timeout"] = "-1s"
    with pytest.raises(AssertionError, match="Envoy rejects"):
        assert_envoy_accepts(document)
