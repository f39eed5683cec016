"""The agent's span for a tunnel call, continuing mgmt-api's REST span.

REST (with a sampled W3C ``traceparent``) → mgmt-api (the fleet's, tracing
only sampled callers) → tunnel → an agent started with ``--otlp-endpoint``
→ real Envoys; both export to the fleet's OTLP receiver (a real gRPC
TraceService). One trace: the REST span, and under it the agent's span.
"""

from __future__ import annotations

from tests.agent.fleet import Fleet, wait_ok
from tests.support.otlp_receiver import ReceivedSpan

TRACE_ID = "8af92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"


def test_a_tunnel_call_is_a_span_under_the_rest_span(fleet: Fleet) -> None:
    # A cluster of its own (the fleet is shared: cluster b must stay unserved).
    fleet.create_cluster("traced")
    agent = fleet.start_agent("traced", "--otlp-endpoint", fleet.otlp.endpoint)
    try:
        spans = _traced_call(fleet)
    finally:
        agent.stop()
    (rest,) = [s for s in spans if s.parent_span_id == PARENT_ID and s.service == "mgmt-api"]
    agents = [s for s in spans if s.service == "meshplane-agent"]
    assert len(agents) == 1  # one span per call (the call covers both web instances)
    assert agents[0].name == "agent tunnel cluster_stats"
    assert agents[0].parent_span_id == rest.span_id
    assert agents[0].attributes == {
        "meshplane.operation": "cluster_stats",
        "meshplane.namespace": "shop",
        "meshplane.workload": "web",
        "meshplane.outcome": "OK",
    }


def _traced_call(fleet: Fleet) -> list[ReceivedSpan]:
    """One clusterstats call with a sampled traceparent; the spans of its trace."""
    headers = {"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"}
    body = {"namespace": "shop", "workload": "web"}
    path = fleet.path("clusterstats", "traced")
    wait_ok(fleet.admin, "POST", path, body)  # untraced: until the new agent's inventory is in
    response = fleet.admin.post(path, json=body, headers=headers)
    assert response.status_code == 200, response.text

    def traced(spans: list[ReceivedSpan]) -> bool:
        mine = [s for s in spans if s.trace_id == TRACE_ID]
        return {s.service for s in mine} >= {"mgmt-api", "meshplane-agent"}

    return [s for s in fleet.otlp.wait_for_spans(traced) if s.trace_id == TRACE_ID]
