"""The gRPC wire and the runtime services, through real sockets, on every server.

One echo supervisor per server (Envoy-based, h2) for the module; every case
runs against each and must come out the same: the wire cases (split DATA
frames, compression, size limit, content-type, unknown methods,
``grpc-timeout``, a client that resets), health Check and Watch, reflection
as grpcurl uses it (one answer before the next request on the same stream), and
the JSON log lines, Envoy's own included.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import time
from collections.abc import Iterator

import grpc
import pytest
from google.protobuf import descriptor_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from tests.runtime.echo_app import SERVICE
from tests.runtime.supervisors import SERVERS, Supervisor
from tests.support.grpc_raw import raw_unary
from tests.support.h2client import H2Client, frame

SLEEP = f"/{SERVICE}/Sleep"


@pytest.fixture(scope="module", params=SERVERS)
def server(request: pytest.FixtureRequest) -> Iterator[Supervisor]:
    sup = Supervisor(request.param, workers=1)
    try:
        sup.wait_serving()
        yield sup
    finally:
        sup.close()


def _h2(server: Supervisor) -> H2Client:
    return H2Client(server.port)


def test_a_message_split_over_several_data_frames_is_reassembled(server: Supervisor) -> None:
    body = frame(b"250")
    with _h2(server) as client:
        answer = client.call(SLEEP, [body[:2], body[2:4], body[4:]])
    assert (answer.grpc_status, answer.data) == (0, frame(b"250"))


def test_a_gzip_message_is_decoded(server: Supervisor) -> None:
    with _h2(server) as client:
        answer = client.call(
            SLEEP,
            [frame(gzip.compress(b"7"), compressed=True)],
            extra=(("grpc-encoding", "gzip"),),
        )
    assert answer.grpc_status == 0
    assert answer.data[5:] == b"7"


@pytest.mark.parametrize("encoding", ["snappy", None])
def test_a_compressed_message_it_cannot_decode_is_refused(
    server: Supervisor, encoding: str | None
) -> None:
    extra = (("grpc-encoding", encoding),) if encoding else ()
    with _h2(server) as client:
        answer = client.call(SLEEP, [frame(b"\x00junk", compressed=True)], extra=extra)
    # UNIMPLEMENTED (an unknown encoding), or INTERNAL (no encoding named).
    assert answer.grpc_status in (12, 13), answer
    assert answer.data == b""


def test_a_message_over_the_size_limit_is_resource_exhausted(server: Supervisor) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        with pytest.raises(grpc.RpcError) as caught:
            raw_unary(channel, SLEEP)(b"0" * (4 * 1024 * 1024 + 1), timeout=30)
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_a_body_that_ends_mid_message_is_an_error(server: Supervisor) -> None:
    """INTERNAL at once, not a wait for the rest until the deadline."""
    with _h2(server) as client:
        answer = client.call(SLEEP, [frame(b"1000")[:6]], extra=(("grpc-timeout", "2S"),))
    assert answer.grpc_status == 13, answer
    assert answer.data == b""


def test_a_wrong_content_type(server: Supervisor) -> None:
    """The gRPC spec says a server SHOULD answer HTTP 415, as grpc-go and our
    adapter do (grpcio's core does not look at the content-type)."""
    with _h2(server) as client:
        answer = client.call(SLEEP, [frame(b"1")], content_type="application/json")
    assert answer.headers.get(":status") == "415", answer
    assert (answer.grpc_status, answer.data) == (None, b"")


def test_an_unknown_method_is_unimplemented(server: Supervisor) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        with pytest.raises(grpc.RpcError) as caught:
            raw_unary(channel, "/no.Such/Method")(b"", timeout=10)
    assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_grpc_timeout_is_enforced_by_the_server(server: Supervisor) -> None:
    """The raw client sends ``grpc-timeout: 300m`` and does not enforce it:
    the server itself must give up and answer DEADLINE_EXCEEDED."""
    with _h2(server) as client:
        started = time.monotonic()
        answer = client.call(SLEEP, [frame(b"20000")], extra=(("grpc-timeout", "300m"),))
        took = time.monotonic() - started
    assert answer.grpc_status == 4, answer
    assert took < 15  # far below the 20 s the handler would have slept


def test_a_client_that_resets_gets_nothing_and_the_server_goes_on(server: Supervisor) -> None:
    with _h2(server) as client:
        stream = client.start(SLEEP, [frame(b"300")])
        client.reset(stream)
        answer = client.call(SLEEP, [frame(b"1")])  # the same connection still works
    assert (answer.grpc_status, answer.data) == (0, frame(b"1"))


def test_a_handler_status_reaches_the_client(server: Supervisor) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        with pytest.raises(grpc.RpcError) as caught:
            raw_unary(channel, SLEEP)(b"fail:not today", timeout=10)
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert caught.value.details() == "not today"


def test_health_check_and_watch(server: Supervisor) -> None:
    async def scenario() -> None:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            for name in ("", SERVICE):
                reply = await stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=10)
                assert reply.status == health_pb2.HealthCheckResponse.SERVING
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.Check(health_pb2.HealthCheckRequest(service="nope"), timeout=10)
            assert caught.value.code() == grpc.StatusCode.NOT_FOUND
            watch = stub.Watch(health_pb2.HealthCheckRequest(service=SERVICE), timeout=10)
            first = await watch.read()
            assert first.status == health_pb2.HealthCheckResponse.SERVING
            unknown = stub.Watch(health_pb2.HealthCheckRequest(service="nope"), timeout=10)
            assert (await unknown.read()).status == health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
            watch.cancel()
            unknown.cancel()

    asyncio.run(scenario())


def test_reflection_answers_each_request_before_the_next_as_grpcurl_asks(
    server: Supervisor,
) -> None:
    """grpcurl ``list`` then ``describe``: one stream, a request, wait for its
    answer, the next request."""

    async def scenario() -> tuple[set[str], list[descriptor_pb2.FileDescriptorProto]]:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = reflection_pb2_grpc.ServerReflectionStub(channel)
            call = stub.ServerReflectionInfo(timeout=15)
            await call.write(reflection_pb2.ServerReflectionRequest(list_services=""))
            listed = await call.read()
            names = {s.name for s in listed.list_services_response.service}
            await call.write(
                reflection_pb2.ServerReflectionRequest(
                    file_containing_symbol="grpc.health.v1.Health"
                )
            )
            described = await call.read()
            await call.done_writing()
            files = list(described.file_descriptor_response.file_descriptor_proto)
            assert await call.read() == grpc.aio.EOF
            return names, [descriptor_pb2.FileDescriptorProto.FromString(f) for f in files]

    names, files = asyncio.run(scenario())
    assert {SERVICE, "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"} <= names
    services = {
        f"{f.package}.{s.name}": [m.name for m in s.method] for f in files for s in f.service
    }
    assert {"Check", "Watch"} <= set(services["grpc.health.v1.Health"])


def test_logs_are_json_lines_envoys_included(server: Supervisor) -> None:
    """Every stderr line of the supervisor and its workers, Envoy's own
    included, is one JSON object (read after the module's other tests, once
    the server has stopped)."""
    text = server.close().decode()
    lines = [line for line in text.splitlines() if line.strip()]
    assert lines
    for line in lines:
        entry = json.loads(line)
        assert entry["service"] == "echo"
        assert {"ts", "level", "pid", "logger", "msg"} <= set(entry)
    assert any(json.loads(line)["msg"] == "worker serving" for line in lines)
