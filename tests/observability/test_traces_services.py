"""Traces from ext_authz and ratelimit without a gateway: the settings table,
both OTLP exporters against real receivers, the spans' parenting and
attributes, and "off / sampling 0 = nothing exported, no span object".

ext_authz runs in-process on the h2 server (real sockets, the official
protos); the W3C context arrives in the CheckRequest's headers as Envoy puts
it there. The one-trace test through a real gateway is test_traces_gateway.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from envoy.service.ratelimit.v3 import rls_pb2
from opentelemetry import trace as trace_api
from opentelemetry.sdk import trace as sdk_trace

from extauthz.app import ExtAuthzApp
from extauthz.cli import mint_demo_token
from meshplane.config_error import ConfigError
from meshplane.rpc import set_trace_context
from meshplane.tracing import TraceSettings, settings_from, start_tracing
from ratelimit.app import build_store
from ratelimit.config import load_config
from ratelimit.service import RateLimitService
from ratelimit.settings import Settings
from ratelimit.store.local_cache import LocalCacheStore
from ratelimit.store.memory import MemoryStore
from tests.extauthz.support import GrpcClient, ServerThread, check_request
from tests.mgmt_api.harness import ADMIN_PASSWORD, MgmtServer, ok
from tests.ratelimit.conftest import T0, descriptor, request, write_config
from tests.support.otlp_receiver import OtlpGrpcReceiver, OtlpHttpReceiver
from tests.support.redis_server import redis_server

SECRET = "traces-test-secret-0123456789abcdef"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"
POLICY = f"""
defaultPolicy: jwt
policies:
  - name: jwt
    jwt:
      algorithms: [HS256]
      keys:
        - hmacSecret: {{value: "{SECRET}"}}
    pathClaim: {{name: path, match: PREFIX}}
"""
LIMITS = """\
domain: traced
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1}
"""

ENV = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317"}


@pytest.mark.parametrize(
    ("env", "flags", "expected"),
    [
        ({}, {}, TraceSettings(service_name="extauthz")),
        (
            ENV,
            {},
            TraceSettings(endpoint="http://collector:4317", service_name="extauthz"),
        ),
        (
            {
                **ENV,
                "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
                "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
                "OTEL_TRACES_SAMPLER_ARG": "0.25",
                "OTEL_SERVICE_NAME": "edge-authz",
            },
            {},
            TraceSettings(
                "http://collector:4317",
                "http/protobuf",
                "parentbased_traceidratio",
                0.25,
                "edge-authz",
            ),
        ),
        (
            {**ENV, "OTEL_TRACES_SAMPLER": "always_off"},
            {},
            TraceSettings("http://collector:4317", sampler="always_off", service_name="extauthz"),
        ),
        (
            ENV,
            {"endpoint": "https://other:4317/", "sampling": 0.01, "protocol": "grpc"},
            TraceSettings(
                "https://other:4317", "grpc", "parentbased_traceidratio", 0.01, "extauthz"
            ),
        ),
    ],
)
def test_settings_from_env_and_flags(
    env: dict[str, str], flags: dict[str, Any], expected: TraceSettings
) -> None:
    assert settings_from(env, service="extauthz", **flags) == expected


@pytest.mark.parametrize(
    ("env", "flags", "field"),
    [
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4317"}, {}, "OTEL_EXPORTER_OTLP_ENDPOINT"),
        ({}, {"endpoint": "ftp://x"}, "--otlp-endpoint"),
        ({**ENV, "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, {}, "OTEL_EXPORTER_OTLP_PROTOCOL"),
        ({**ENV, "OTEL_TRACES_SAMPLER": "jaeger_remote"}, {}, "OTEL_TRACES_SAMPLER"),
        (
            {**ENV, "OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "1.5"},
            {},
            "OTEL_TRACES_SAMPLER_ARG",
        ),
        (ENV, {"sampling": float("nan")}, "--trace-sampling"),
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://" + "a" * 3000},
            {},
            "OTEL_EXPORTER_OTLP_ENDPOINT",
        ),
    ],
)
def test_bad_settings_name_the_variable_or_flag(
    env: dict[str, str], flags: dict[str, Any], field: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        settings_from(env, service="x", **flags)
    assert caught.value.field == field


@pytest.mark.parametrize(
    "settings",
    [
        None,
        TraceSettings(),  # no endpoint: the default
        TraceSettings("http://127.0.0.1:1", sampler="always_off"),
        TraceSettings("http://127.0.0.1:1", sampler="parentbased_traceidratio", ratio=0.0),
    ],
)
def test_off_and_sampling_zero_start_nothing(settings: TraceSettings | None) -> None:
    assert start_tracing(settings) is None


@pytest.fixture
def span_objects(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Every span object constructed (SDK or non-recording), counted by wrapping
    the real constructors: the behaviour is unchanged."""
    made: list[object] = []
    for cls in (sdk_trace.Span, trace_api.NonRecordingSpan):
        original = cls.__init__

        def counting(self: Any, *args: Any, _original: Any = original, **kw: Any) -> None:
            made.append(self)
            _original(self, *args, **kw)

        monkeypatch.setattr(cls, "__init__", counting)
    return made


@pytest.fixture(scope="module")
def grpc_receiver() -> Iterator[OtlpGrpcReceiver]:
    with OtlpGrpcReceiver() as receiver:
        yield receiver


def _policy(tmp_path: Path) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY)
    return path


def test_extauthz_sampling_zero_exports_nothing_and_makes_no_span(
    tmp_path: Path, grpc_receiver: OtlpGrpcReceiver, span_objects: list[object]
) -> None:
    settings = TraceSettings(grpc_receiver.endpoint, sampler="traceidratio", ratio=0.0)
    token = mint_demo_token(SECRET, "/", 600)
    app: ExtAuthzApp | None = None

    def factory() -> ExtAuthzApp:
        nonlocal app
        app = ExtAuthzApp(_policy(tmp_path), tracing=settings)
        return app

    before = len(grpc_receiver.spans())
    with ServerThread(factory) as server:
        client = GrpcClient(server.port)
        for headers in ({"traceparent": TRACEPARENT}, {"authorization": f"Bearer {token}"}):
            client.check(check_request("/x", headers))
        client.close()
        assert app is not None and app.tracing is None
    assert span_objects == []
    assert len(grpc_receiver.spans()) == before


def test_extauthz_check_continues_envoys_trace(
    tmp_path: Path, grpc_receiver: OtlpGrpcReceiver
) -> None:
    """One span per Check, child of the traceparent in the request headers,
    with decision, reason and policy, and never the token."""
    settings = TraceSettings(grpc_receiver.endpoint, service_name="extauthz")
    token = mint_demo_token(SECRET, "/allowed", 600)
    with ServerThread(lambda: ExtAuthzApp(_policy(tmp_path), tracing=settings)) as server:
        client = GrpcClient(server.port)
        auth = {"traceparent": TRACEPARENT, "authorization": f"Bearer {token}"}
        client.check(check_request("/allowed/a", auth))
        client.check(check_request("/denied", auth))
        client.close()
    # The worker's stop() flushed the batch processor (the SIGTERM drain path).
    mine = [s for s in grpc_receiver.spans() if s.trace_id == TRACE_ID]
    assert len(mine) == 2
    assert {s.parent_span_id for s in mine} == {PARENT_ID}
    assert all(s.service == "extauthz" and s.name == "extauthz Check" for s in mine)
    decisions = sorted(
        (s.attributes["meshplane.decision"], s.attributes["meshplane.reason"]) for s in mine
    )
    assert decisions[0][0] == "allow" and decisions[1][0] == "deny"
    assert {s.attributes["meshplane.policy"] for s in mine} == {"jwt"}
    assert token not in repr(mine) and SECRET not in repr(mine)


def test_ratelimit_span_with_store_child_over_http_exporter(tmp_path: Path) -> None:
    config = load_config(write_config(tmp_path, "traced.yaml", LIMITS))
    with OtlpHttpReceiver() as receiver:
        tracing = start_tracing(
            TraceSettings(receiver.endpoint, "http/protobuf", service_name="ratelimit")
        )
        assert tracing is not None
        service = RateLimitService(
            lambda: config, MemoryStore(), Settings(), clock=lambda: T0, tracing=tracing
        )
        raw = request("traced", descriptor(("user", "secret-api-key"))).SerializeToString()

        async def twice() -> list[int]:
            codes = []
            for _ in range(2):
                set_trace_context(TRACEPARENT, None)  # as the server does from the metadata
                codes.append(
                    rls_pb2.RateLimitResponse.FromString(await service.decide(raw)).overall_code
                )
            await service.close()
            return codes

        codes = asyncio.run(twice())
        assert codes == [rls_pb2.RateLimitResponse.OK, rls_pb2.RateLimitResponse.OVER_LIMIT]
        tracing.shutdown()
        spans = receiver.wait_for_spans(lambda got: len(got) >= 4)
    calls = [s for s in spans if s.name == "ratelimit ShouldRateLimit"]
    stores = [s for s in spans if s.name == "ratelimit store memory"]
    assert len(calls) == 2 and len(stores) == 2
    assert {s.parent_span_id for s in calls} == {PARENT_ID}
    assert {s.parent_span_id for s in stores} == {s.span_id for s in calls}
    assert sorted(s.attributes["meshplane.decision"] for s in calls) == ["allow", "deny"]
    assert all(s.attributes["meshplane.policy"] == ["user"] for s in calls)
    assert "secret-api-key" not in repr(spans)


def test_ratelimit_store_span_names_redis_behind_the_local_cache(
    tmp_path: Path, grpc_receiver: OtlpGrpcReceiver
) -> None:
    """The store stack as deployed (the local cache of empty buckets in front
    of a real redis-server): the store span says ``redis``, for the call the
    store answered and for the one the cache answered in front of it."""
    config = load_config(write_config(tmp_path, "traced.yaml", LIMITS))
    tracing = start_tracing(TraceSettings(grpc_receiver.endpoint, service_name="ratelimit"))
    assert tracing is not None
    trace_id = "8ef92f3577b34da6a3ce929d0e0e4736"
    raw = request("traced", descriptor(("user", "u"))).SerializeToString()
    with redis_server() as redis:
        store, _ = build_store(Settings(), redis.url)
        assert isinstance(store, LocalCacheStore)
        service = RateLimitService(
            lambda: config, store, Settings(), clock=lambda: T0, tracing=tracing
        )

        async def three() -> None:
            for _ in range(3):  # allowed, denied by Redis, denied by the cache
                set_trace_context(f"00-{trace_id}-{PARENT_ID}-01", None)
                await service.decide(raw)
            await service.close()

        asyncio.run(three())
    tracing.shutdown()
    spans = grpc_receiver.wait_for_spans(
        lambda got: len([s for s in got if s.trace_id == trace_id]) >= 6
    )
    names = sorted(s.name for s in spans if s.trace_id == trace_id)
    assert names == ["ratelimit ShouldRateLimit"] * 3 + ["ratelimit store redis"] * 3


def test_ratelimit_sampling_zero_makes_no_span(tmp_path: Path, span_objects: list[object]) -> None:
    config = load_config(write_config(tmp_path, "traced.yaml", LIMITS))
    tracing = start_tracing(TraceSettings("http://127.0.0.1:1", sampler="traceidratio", ratio=0))
    service = RateLimitService(
        lambda: config,
        MemoryStore(),
        Settings(),
        clock=lambda: T0,
        tracing=tracing,
    )
    raw = request("traced", descriptor(("user", "u"))).SerializeToString()

    async def once() -> None:
        set_trace_context(TRACEPARENT, None)
        await service.decide(raw)
        await service.close()

    asyncio.run(once())
    assert tracing is None and span_objects == []


WRITE_TRACE = "6cf92f3577b34da6a3ce929d0e0e4736"
UNSAMPLED_TRACE = "7df92f3577b34da6a3ce929d0e0e4736"


def test_mgmt_api_rest_spans_with_db_and_publish_children(
    grpc_receiver: OtlpGrpcReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A REST write under a sampled traceparent: the REST span (named by the
    route template) with a db write and a publish child; a read: a db read
    child; an unsampled caller: no span at all."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", grpc_receiver.endpoint)
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "200")  # the SDK's batch delay, ms
    server = MgmtServer().start()
    body = {"name": "traced-org", "organization": {}}
    try:
        admin = server.admin()
        unsampled = {"traceparent": f"00-{UNSAMPLED_TRACE}-{PARENT_ID}-00"}
        ok(admin.post("/v2/organizations", json={**body, "name": "quiet-org"}, headers=unsampled))
        sampled = {"traceparent": f"00-{WRITE_TRACE}-{PARENT_ID}-01"}
        ok(admin.post("/v2/organizations", json=body, headers=sampled))
        ok(admin.get("/v2/organizations/traced-org", headers={"traceparent": TRACEPARENT}))
        admin.close()
        names = {"mgmt-api db write", "mgmt-api publish", "mgmt-api db read"}
        spans = grpc_receiver.wait_for_spans(
            lambda got: (
                names <= {s.name for s in got if s.trace_id == WRITE_TRACE}
                and any(
                    # the receiver is the module's: other services' spans carry this trace too
                    s.service == "mgmt-api"
                    and s.trace_id == TRACE_ID
                    and s.parent_span_id == PARENT_ID
                    for s in got
                )
            )
        )
    finally:
        server.close()
    assert not [s for s in spans if s.trace_id == UNSAMPLED_TRACE]
    mgmt = [s for s in spans if s.service == "mgmt-api"]  # the receiver is the module's
    (get,) = [s for s in mgmt if s.trace_id == TRACE_ID and s.parent_span_id == PARENT_ID]
    assert get.attributes["http.response.status_code"] == 200
    assert get.name == f"GET {get.attributes['http.route']}"
    assert "traced-org" not in get.name  # the template, not the raw path
    reads = [s for s in spans if s.parent_span_id == get.span_id]
    assert reads and {s.name for s in reads} == {"mgmt-api db read"}
    write_trace = [s for s in spans if s.trace_id == WRITE_TRACE]
    (post,) = [s for s in write_trace if s.parent_span_id == PARENT_ID]
    assert post.service == "mgmt-api" and post.name == f"POST {post.attributes['http.route']}"
    children = {s.name: s for s in write_trace if s.parent_span_id == post.span_id}
    write, publish = children["mgmt-api db write"], children["mgmt-api publish"]
    assert write.attributes["db.system"] == "sqlite" and write.attributes["meshplane.audited"] >= 1
    assert publish.attributes["meshplane.revision"] == write.attributes["meshplane.revision"]
    assert ADMIN_PASSWORD not in repr(write_trace)


def test_ratelimit_sampled_out_call_makes_no_span_a_sampled_parent_does(
    tmp_path: Path, grpc_receiver: OtlpGrpcReceiver, span_objects: list[object]
) -> None:
    """Tracing on at 1 %: a call whose parent is not sampled takes the untraced
    path (no span object, not even the store's); a sampled parent's call is traced."""
    config = load_config(write_config(tmp_path, "traced.yaml", LIMITS))
    tracing = start_tracing(TraceSettings(grpc_receiver.endpoint, ratio=0.01,
                                          sampler="parentbased_traceidratio"))  # fmt: skip
    assert tracing is not None
    service = RateLimitService(
        lambda: config, MemoryStore(), Settings(), clock=lambda: T0, tracing=tracing
    )
    raw = request("traced", descriptor(("user", "u"))).SerializeToString()
    trace_id = "5bf92f3577b34da6a3ce929d0e0e4736"

    async def call(traceparent: str) -> None:
        set_trace_context(traceparent, None)
        await service.decide(raw)

    asyncio.run(call(f"00-{trace_id}-{PARENT_ID}-00"))
    assert span_objects == []
    asyncio.run(call(f"00-{trace_id}-{PARENT_ID}-01"))
    asyncio.run(service.close())
    tracing.shutdown()
    # the call's span and the store's (the remote parent is wrapped in a NonRecordingSpan)
    assert len([s for s in span_objects if isinstance(s, sdk_trace.Span)]) == 2
    spans = [s for s in grpc_receiver.spans() if s.trace_id == trace_id]
    assert sorted(s.name for s in spans) == ["ratelimit ShouldRateLimit", "ratelimit store memory"]
