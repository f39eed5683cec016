"""Prometheus metrics that stay correct when a service runs several workers.

Each worker is its own process, so a plain in-memory registry would show a
random worker's numbers on every scrape. The supervisor therefore points
``PROMETHEUS_MULTIPROC_DIR`` at a fresh directory *before* it spawns workers;
prometheus_client in the workers then writes its values to per-process files
there, and the supervisor's ``/metrics`` endpoint sums them with
``MultiProcessCollector``. Services just declare ordinary module-level metrics.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    generate_latest,
    multiprocess,
    start_http_server,
)

from meshplane.netaddr import parse_listen

__all__ = [
    "CONTENT_TYPE_LATEST",
    "mark_worker_dead",
    "prepare_multiprocess_dir",
    "render_latest",
    "start_metrics_server",
]

_ENV = "PROMETHEUS_MULTIPROC_DIR"


def prepare_multiprocess_dir(service: str) -> Path:
    """Create an empty per-run directory and export it to future workers.

    An operator-provided ``PROMETHEUS_MULTIPROC_DIR`` is honoured but emptied:
    stale files from a previous run would resurrect old counter values.
    """
    configured = os.environ.get(_ENV)
    if configured:
        path = Path(configured)
        if path.exists():
            for child in path.glob("*.db"):
                child.unlink()
        path.mkdir(parents=True, exist_ok=True)
    else:
        path = Path(tempfile.mkdtemp(prefix=f"meshplane-{service}-metrics-"))
        os.environ[_ENV] = str(path)
    return path


def cleanup_multiprocess_dir(path: Path) -> None:
    """Remove a directory made by :func:`prepare_multiprocess_dir`."""
    if path.name.startswith("meshplane-"):
        shutil.rmtree(path, ignore_errors=True)


def _registry() -> CollectorRegistry:
    if os.environ.get(_ENV):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        return registry
    return REGISTRY


def render_latest() -> bytes:
    """The text exposition of every metric of this service (all workers)."""
    return generate_latest(_registry())


def start_metrics_server(listen: str) -> int:
    """Serve ``/metrics`` on ``listen`` from a daemon thread; return the port."""
    host, port = parse_listen(listen)
    server, _thread = start_http_server(port, addr=host, registry=_registry())
    return int(server.server_port)


def mark_worker_dead(pid: int) -> None:
    """Drop a dead worker's live gauges (counters keep their totals)."""
    if os.environ.get(_ENV):
        multiprocess.mark_process_dead(pid)  # type: ignore[no-untyped-call]
