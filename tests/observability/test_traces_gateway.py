"""One request through a real gateway Envoy makes ONE trace: the gateway's
server span, its ext_authz and ratelimit client spans, the ext_authz and
ratelimit services' spans under them (ratelimit with its Redis child), and
the upstream span, all received by the OTLP/gRPC receiver this test runs.
The request carries no ``traceparent``: the gateway starts the trace, and
ext_authz's decision line names it (read from the call's metadata).

The gateway's tracer comes over ADS from the Cluster's ``tracing`` setting;
the services export with ``--otlp-endpoint``. Nothing is mocked.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from extauthz.cli import mint_demo_token
from tests.mgmt_api.harness import ok
from tests.support.gateway import CLUSTER_PATH, GatewayStack
from tests.support.otlp_receiver import OtlpGrpcReceiver, ReceivedSpan
from tests.support.processes import wait_until

SECRET = "traces-gateway-secret-0123456789abcdef"
SPAN_KINDS = {"server": 2, "client": 3}


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpGrpcReceiver]:
    with OtlpGrpcReceiver() as otlp:
        yield otlp


@pytest.fixture(scope="module")
def stack(
    tmp_path_factory: pytest.TempPathFactory, receiver: OtlpGrpcReceiver
) -> Iterator[GatewayStack]:
    st = GatewayStack(
        Path(tmp_path_factory.mktemp("traces")),
        service_args=(
            *("--otlp-endpoint", receiver.endpoint, "--trace-sampling", "1"),
            *("--decision-log-allow-sample", "1"),
        ),
    )
    try:
        st.backend("default.app")
        st.route("secure.web", "/headers", backend="default.app")
        st.jwt_security(SECRET)
        st.rate_limit("secure.web-limit", "web", (100, "Minute"))
        st.cluster_spec(
            tracing={
                "collector": f"grpc://127.0.0.1:{receiver.port}",
                "samplingPercentage": 100,
            }
        )
        st.gateway()
        st.converged()
        yield st
    finally:
        st.close()


def _one_trace(spans: list[ReceivedSpan], trace_id: str) -> list[ReceivedSpan]:
    return [s for s in spans if s.trace_id == trace_id]


def test_cluster_config_shows_tracing(stack: GatewayStack) -> None:
    config = ok(stack.admin.post(f"{CLUSTER_PATH}/config"))
    assert config["tracing"]["samplingPercentage"] == 100
    bad = stack.admin.put(
        CLUSTER_PATH,
        json={
            "tracing": {"collector": "http://x:1", "samplingPercentage": 100},
            "etag": ok(stack.admin.get(CLUSTER_PATH))["etag"],
        },
    )
    assert bad.status_code == 400, bad.text
    assert "tracing.collector" in bad.text


def test_one_request_makes_one_trace(stack: GatewayStack, receiver: OtlpGrpcReceiver) -> None:
    token = mint_demo_token(SECRET, "/headers", 600)
    response = stack.gateways[0].get("/headers", token)
    assert response.status_code == 200, response.text

    def complete(spans: list[ReceivedSpan]) -> bool:
        services = {s.service for s in spans}
        return (
            {"extauthz", "ratelimit"} <= services
            and any(s.name == "ratelimit store redis" for s in spans)
            and len({s.service for s in spans}) >= 3
        )

    spans = receiver.wait_for_spans(complete)
    roots = [s for s in spans if not s.parent_span_id]
    assert len(roots) == 1, [(s.service, s.name) for s in spans]
    trace = _one_trace(spans, roots[0].trace_id)
    assert len(trace) == len(spans), "every span belongs to the one trace"
    by_id = {s.span_id: s for s in trace}
    root = roots[0]
    assert root.kind == SPAN_KINDS["server"] and root.service == "gateway"

    def parent(span: ReceivedSpan) -> ReceivedSpan:
        return by_id[span.parent_span_id]

    (authz,) = [s for s in trace if s.name == "extauthz Check"]
    (limit,) = [s for s in trace if s.name == "ratelimit ShouldRateLimit"]
    (store,) = [s for s in trace if s.name == "ratelimit store redis"]
    assert parent(store) is limit
    for service_span in (authz, limit):
        client = parent(service_span)
        assert client.service == "gateway" and client.kind == SPAN_KINDS["client"]
        assert parent(client) is root
    assert authz.attributes["meshplane.decision"] == "allow"
    assert authz.attributes["meshplane.policy"] == "t.w.g.jwt"  # the policy FQN mgmt-api streams
    assert limit.attributes["meshplane.decision"] == "allow"
    upstream = [
        s
        for s in trace
        if s.service == "gateway"
        and s.kind == SPAN_KINDS["client"]
        and s not in (parent(authz), parent(limit))
    ]
    assert len(upstream) == 1 and parent(upstream[0]) is root
    assert token not in repr(trace) and SECRET not in repr(trace)
    # The decision line names the trace the gateway started (and sent upstream).
    assert upstream[0].trace_id == root.trace_id
    lines = wait_until(lambda: _allow_lines(stack), 30, "extauthz's allow line")
    assert [line["trace_id"] for line in lines] == [root.trace_id], lines


def _allow_lines(stack: GatewayStack) -> list[dict[str, object]]:
    """extauthz's allow decision lines (stderr, its default sink)."""
    text = (stack.tmp / "extauthz.log").read_text(errors="replace")
    found = (json.loads(line) for line in text.splitlines() if '"decision_id"' in line)
    return [line for line in found if line.get("decision") == "allow"]
