"""A real OTLP/gRPC logs receiver for tests: ``LogsService/Export`` on a grpcio server.

It keeps every ExportLogsServiceRequest it is sent, so a test can check
what a collector would have received. Use as a context manager: the server
(and its port) does not outlive the ``with`` block.
"""

from __future__ import annotations

import threading
from concurrent import futures
from types import TracebackType
from typing import Any

import grpc
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2, logs_service_pb2_grpc
from opentelemetry.proto.logs.v1 import logs_pb2


class _Logs(logs_service_pb2_grpc.LogsServiceServicer):
    def __init__(self) -> None:
        self.requests: list[logs_service_pb2.ExportLogsServiceRequest] = []
        self.lock = threading.Lock()

    def Export(
        self, request: logs_service_pb2.ExportLogsServiceRequest, context: Any
    ) -> logs_service_pb2.ExportLogsServiceResponse:
        with self.lock:
            self.requests.append(request)
        return logs_service_pb2.ExportLogsServiceResponse()


class OtlpLogsReceiver:
    """``with OtlpLogsReceiver() as rx: ... rx.endpoint ... rx.records()``."""

    def __init__(self) -> None:
        self._servicer = _Logs()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        logs_service_pb2_grpc.add_LogsServiceServicer_to_server(  # type: ignore[no-untyped-call]
            self._servicer, self._server
        )
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        self.endpoint = f"127.0.0.1:{self.port}"

    def __enter__(self) -> OtlpLogsReceiver:
        self._server.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._server.stop(grace=None).wait(30)

    def records(self) -> list[tuple[str, logs_pb2.LogRecord]]:
        """Every received record with its resource's ``service.name``."""
        found: list[tuple[str, logs_pb2.LogRecord]] = []
        with self._servicer.lock:
            for request in self._servicer.requests:
                for resource_logs in request.resource_logs:
                    service = next(
                        (
                            a.value.string_value
                            for a in resource_logs.resource.attributes
                            if a.key == "service.name"
                        ),
                        "",
                    )
                    for scope_logs in resource_logs.scope_logs:
                        found.extend((service, r) for r in scope_logs.log_records)
        return found
