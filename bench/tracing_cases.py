"""Tracing cases for the hot-path benches (issue 27): the same server with
tracing off, at 1% and at 100% sampling, exporting over OTLP/gRPC to a real
receiver in this process (``tests/support/otlp_receiver.py``).

The bench's requests carry no ``traceparent``, so the sampling decision is
the service's own (``--trace-sampling`` = parentbased_traceidratio with no
parent = the ratio). "Off" is the flagless server: no provider at all.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

from bench import h2grpc

sys.path.insert(0, str(h2grpc.ROOT))

from tests.support.otlp_receiver import OtlpGrpcReceiver

#: case suffix -> --trace-sampling
RATIOS = {"trace-1pct": "0.01", "trace-100pct": "1"}


@contextlib.contextmanager
def receiver() -> Iterator[OtlpGrpcReceiver]:
    with OtlpGrpcReceiver() as sink:
        yield sink


def flags(sink: OtlpGrpcReceiver, ratio: str) -> list[str]:
    return ["--otlp-endpoint", sink.endpoint, "--trace-sampling", ratio]


def exported(sink: OtlpGrpcReceiver) -> str:
    return f"spans exported to the bench's OTLP receiver: {len(sink.spans())}"
