"""OTLP receivers the tests run: a real gRPC server (TraceService and
LogsService from opentelemetry-proto) and a small real HTTP server for
OTLP/HTTP (``POST /v1/traces``, ``POST /v1/logs``, protobuf bodies).

Both keep every request they get; :meth:`spans` flattens the traces into
:class:`ReceivedSpan` (service name from the resource, ids as hex), and
:meth:`wait_for_spans` polls with a generous deadline (never a fixed sleep).
Use them as context managers: nothing they start outlives the test.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2, logs_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1 import common_pb2

from tests.support.processes import wait_until

_MAX_BODY = 16 * 1024 * 1024


@dataclass(frozen=True)
class ReceivedSpan:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    kind: int
    attributes: dict[str, Any]


def _value(value: common_pb2.AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    return None if kind is None else getattr(value, kind)


def _attributes(items: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in items}


class _Store:
    """What a receiver got, shared by its threads."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.traces: list[trace_service_pb2.ExportTraceServiceRequest] = []
        self.logs: list[logs_service_pb2.ExportLogsServiceRequest] = []

    def spans(self) -> list[ReceivedSpan]:
        with self.lock:
            requests = list(self.traces)
        return list(_flatten(requests))

    def wait_for_spans(
        self, predicate: Callable[[list[ReceivedSpan]], bool], timeout: float = 60.0
    ) -> list[ReceivedSpan]:
        def ready() -> list[ReceivedSpan] | None:
            spans = self.spans()
            return spans if predicate(spans) else None

        return wait_until(ready, timeout, "the OTLP receiver to get the expected spans")


def _flatten(
    requests: list[trace_service_pb2.ExportTraceServiceRequest],
) -> Iterator[ReceivedSpan]:
    for request in requests:
        for resource_spans in request.resource_spans:
            service = _attributes(resource_spans.resource.attributes).get("service.name", "")
            for scope in resource_spans.scope_spans:
                for span in scope.spans:
                    yield ReceivedSpan(
                        service=service,
                        name=span.name,
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_span_id=span.parent_span_id.hex(),
                        kind=span.kind,
                        attributes=_attributes(span.attributes),
                    )


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, store: _Store) -> None:
        self._store = store

    def Export(
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: Any
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        with self._store.lock:
            self._store.traces.append(request)
        return trace_service_pb2.ExportTraceServiceResponse()


class _LogsService(logs_service_pb2_grpc.LogsServiceServicer):
    def __init__(self, store: _Store) -> None:
        self._store = store

    def Export(
        self, request: logs_service_pb2.ExportLogsServiceRequest, context: Any
    ) -> logs_service_pb2.ExportLogsServiceResponse:
        with self._store.lock:
            self._store.logs.append(request)
        return logs_service_pb2.ExportLogsServiceResponse()


class OtlpGrpcReceiver(_Store):
    """A grpc server on a free loopback port; ``endpoint`` is ``http://127.0.0.1:PORT``."""

    def __init__(self) -> None:
        super().__init__()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(  # type: ignore[no-untyped-call]
            _TraceService(self), self._server
        )
        logs_service_pb2_grpc.add_LogsServiceServicer_to_server(  # type: ignore[no-untyped-call]
            _LogsService(self), self._server
        )
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._server.start()

    def close(self) -> None:
        self._server.stop(grace=None).wait(30)

    def __enter__(self) -> OtlpGrpcReceiver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class OtlpHttpReceiver(_Store):
    """OTLP/HTTP on a free loopback port; ``endpoint`` is ``http://127.0.0.1:PORT``."""

    def __init__(self) -> None:
        super().__init__()
        store = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", "0"))
                ctype = self.headers.get("content-type", "")
                if length > _MAX_BODY or ctype != "application/x-protobuf":
                    self.send_response(400)
                    self.end_headers()
                    return
                body = self.rfile.read(length)
                if self.path == "/v1/traces":
                    request = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
                    with store.lock:
                        store.traces.append(request)
                elif self.path == "/v1/logs":
                    logs = logs_service_pb2.ExportLogsServiceRequest.FromString(body)
                    with store.lock:
                        store.logs.append(logs)
                else:
                    self.send_response(404)
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self._httpd.server_address[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(30)

    def __enter__(self) -> OtlpHttpReceiver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
