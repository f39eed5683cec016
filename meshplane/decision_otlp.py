"""Export of decision lines over OTLP logs (``LogsService/Export``, gRPC).

Runs only in the decision log's writer thread, never on a request: a batch
of lines becomes one ``ExportLogsServiceRequest``, encoded with
opentelemetry-exporter-otlp-proto-common (the collector sees the same
records the SDK's exporter would send) and sent over grpcio with a
deadline. A batch the collector does not take is dropped and counted by the
caller, never retried forever: decision lines also go to the local sink,
which is the record of truth.

Each line is one log record: the body is the line itself (a map), the
trace id is set from the line's ``trace_id`` so a backend links the record
to the request's trace, and ``decision_id`` is also an attribute for search.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import grpc
from opentelemetry._logs import LogRecord, SeverityNumber
from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2_grpc
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.sdk._logs import ReadableLogRecord
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

EXPORT_TIMEOUT_SECONDS = 5.0
_SCOPE = InstrumentationScope("meshplane.decisions")


def _trace_id(line: Mapping[str, Any]) -> int | None:
    value = line.get("trace_id")
    return int(value, 16) if isinstance(value, str) else None


def encode(
    service: str, lines: Sequence[Mapping[str, Any]], now_ns: int
) -> ExportLogsServiceRequest:
    """The OTLP request carrying ``lines`` (pure: the time is passed in)."""
    resource = Resource({"service.name": service})
    records = [
        ReadableLogRecord(
            LogRecord(
                timestamp=now_ns,
                observed_timestamp=now_ns,
                trace_id=_trace_id(line),
                severity_text="INFO",
                severity_number=SeverityNumber.INFO,
                body=dict(line),
                attributes={"decision_id": str(line.get("decision_id", ""))},
            ),
            resource,
            _SCOPE,
        )
        for line in lines
    ]
    return encode_logs(records)


class OtlpLogExporter:
    """Sends batches of decision lines to an OTLP/gRPC logs endpoint (``HOST:PORT``)."""

    def __init__(self, service: str, endpoint: str) -> None:
        self._service = service
        self._channel = grpc.insecure_channel(endpoint)
        self._stub = logs_service_pb2_grpc.LogsServiceStub(self._channel)  # type: ignore[no-untyped-call]

    def export(self, lines: Sequence[Mapping[str, Any]]) -> None:
        """Send one batch; raises grpc.RpcError when the collector does not take it."""
        request = encode(self._service, lines, time.time_ns())
        self._stub.Export(request, timeout=EXPORT_TIMEOUT_SECONDS)

    def close(self) -> None:
        self._channel.close()
