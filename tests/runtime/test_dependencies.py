"""The protobuf module tree is consistent: nothing shadows anything.

xds-protos ships its own top-level ``google/rpc`` and ``google/api``
modules. googleapis-common-protos (pulled in by grpcio-status) ships the same
module names; with both installed, whichever unpacked last wins, and a
descriptor-pool conflict surfaces only at import time in production.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from pathlib import Path

import pytest


@pytest.mark.parametrize("dist", ["googleapis-common-protos", "grpcio-status", "envoy-data-plane"])
def test_conflicting_distributions_are_not_installed(dist: str) -> None:
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.distribution(dist)


def test_google_rpc_and_api_come_from_xds_protos() -> None:
    files = {str(f) for f in importlib.metadata.distribution("xds-protos").files or []}
    for module in ("google.rpc.status_pb2", "google.api.annotations_pb2"):
        path = Path(importlib.import_module(module).__file__ or "")
        relative = "/".join(path.parts[-3:])
        assert relative in files, f"{module} is not xds-protos's copy: {path}"


@pytest.mark.parametrize(
    "module",
    [
        "envoy.service.auth.v3.external_auth_pb2_grpc",
        "envoy.service.ratelimit.v3.rls_pb2_grpc",
        "envoy.config.bootstrap.v3.bootstrap_pb2",
        "envoy.extensions.filters.http.ext_authz.v3.ext_authz_pb2",
        "envoy.extensions.filters.http.ratelimit.v3.rate_limit_pb2",
        "envoy.extensions.filters.network.http_connection_manager.v3.http_connection_manager_pb2",
        "grpc_health.v1.health_pb2_grpc",
        "grpc_reflection.v1alpha.reflection_pb2_grpc",
        "meshplane.proto.distribution.v1.distribution_pb2_grpc",
    ],
)
def test_every_contract_module_imports_together(module: str) -> None:
    importlib.import_module(module)
