"""From the agent's replies to the REST records (pure).

Each instance answers separately: the response lists every instance, with
its answer or its error. When no instance answered, the request fails with
the first instance's error (a single hung proxy is a 504, a single refused
filter a 400 naming the field), and every instance's error is in the
details.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from meshplane.proto.tunnel.v1 import tunnel_pb2 as pb
from mgmt_api.errors import ApiError, Code


def api_error(status: pb.Status, **metadata: str) -> ApiError:
    """The agent's status as the API's error (an unknown code is INTERNAL)."""
    try:
        code = Code(status.code)
    except ValueError:
        code = Code.INTERNAL
    return ApiError(code, status.message, metadata=metadata, field=status.field or None)


def workload_view(workload: pb.Workload) -> dict[str, str]:
    return {
        "namespace": workload.namespace,
        "workload": workload.workload,
        "instance": workload.instance,
    }


def status_view(status: pb.Status) -> dict[str, Any]:
    body: dict[str, Any] = api_error(status).body()
    return body


@dataclass(frozen=True)
class InstanceResult:
    workload: pb.Workload
    payload: dict[str, Any] | None = None
    error: pb.Status | None = None


def assemble(results: list[InstanceResult]) -> dict[str, Any]:
    """``{"instances": [...]}`` in instance order; raises the error when none answered."""
    ordered = sorted(results, key=lambda r: r.workload.instance)
    if ordered and all(r.error is not None for r in ordered):
        first = ordered[0]
        assert first.error is not None
        error = api_error(first.error, instance=first.workload.instance)
        error.metadata.update(
            {
                f"error.{r.workload.instance}": r.error.message
                for r in ordered[1:]
                if r.error is not None
            }
        )
        raise error
    instances = []
    for result in ordered:
        view: dict[str, Any] = workload_view(result.workload)
        if result.error is not None:
            view["error"] = status_view(result.error)
        else:
            view.update(result.payload or {})
        instances.append(view)
    return {"instances": instances}
