"""The supervisor of every meshplane gRPC service: N workers on one port.

``serve()`` starts N worker processes that each bind the same port with
SO_REUSEPORT (the kernel spreads connections between them), serves the
workers' merged Prometheus metrics, restarts a worker that dies, and on
SIGTERM asks every worker to drain; a worker whose supervisor is gone
(killed outright) drains and exits by itself.

``listen`` may also be ``unix:/PATH``, a Unix domain socket (the services in
the gateway's pod): one worker serves it, since a socket path has no
SO_REUSEPORT (:func:`meshplane.netaddr.check_serve_listen`).

Two backends carry the same apps (``ServeOptions.server``), picked from
:data:`BACKENDS`; the supervisor knows them only through
:mod:`meshplane.server_contract`:

- ``envoy`` (the default): each worker is an Envoy process that terminates
  HTTP/2 and TLS and runs the app in its embedded Python (pyvoy), behind the
  ASGI gRPC adapter of :mod:`meshplane.asgi_grpc`; see
  :mod:`meshplane.servers.envoy.server` and :mod:`meshplane.servers.envoy.worker`;
- ``h2`` (opt-in): each worker is a spawned Python process on uvloop that
  speaks HTTP/2 itself (:mod:`meshplane.servers.h2.server`, :mod:`meshplane.servers.h2.http2`)
  and runs the same ASGI gRPC adapter as ``envoy``: the cheapest per call
  (no thread hand-off), without Envoy's hardened codec and overload manager.

Apps never see the difference: they register ``bytes -> bytes`` unary
handlers and flip readiness on a :class:`~meshplane.rpc.HealthState`
(:class:`~meshplane.server_contract.WorkerContext`). Every backend registers
``grpc.health.v1.Health`` and server reflection, take the same TLS options,
run the app's optional ASGI app (``http_app``) on a second port under
uvicorn, and drain the same way: NOT_SERVING, stop accepting, let in-flight
calls finish within ``grace_seconds``.
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from meshplane import metrics
from meshplane.logging import configure_logging
from meshplane.netaddr import check_serve_listen
from meshplane.server_contract import (
    Backend,
    GrpcApp,
    ServeOptions,
    ServerKind,
    StartWorker,
    WorkerProcess,
)
from meshplane.servers.envoy.server import envoy_starter
from meshplane.servers.h2.server import h2_starter

log = logging.getLogger(__name__)

#: The backend of each ``--server`` choice.
BACKENDS: Mapping[ServerKind, Backend] = {
    "envoy": envoy_starter,
    "h2": h2_starter,
}

# A worker that dies this soon after its start is not restarted: it would
# crash-loop (bad port, bad config); the supervisor exits with its code.
_STARTUP_WINDOW_SECONDS = 5.0


@dataclass
class _Slot:
    index: int
    process: WorkerProcess
    started: float


def serve(app_factory: Callable[[], GrpcApp], options: ServeOptions, *, service: str) -> int:
    """Run the supervisor until SIGTERM/SIGINT; return the process exit code."""
    configure_logging(service)
    if options.workers < 1:
        raise ValueError("workers must be at least 1")
    check_serve_listen(options.listen, options.workers)
    backend = BACKENDS[options.server]
    metrics_dir = metrics.prepare_multiprocess_dir(service)
    if options.metrics_listen:
        port = metrics.start_metrics_server(options.metrics_listen)
        log.info("metrics endpoint up", extra={"listen": options.metrics_listen, "port": port})

    stopping = False

    def request_stop(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)

    with backend(app_factory, options, service) as start_worker:
        exit_code = _supervise(start_worker, options, lambda: stopping)
    metrics.cleanup_multiprocess_dir(metrics_dir)
    log.info("supervisor stopped", extra={"exit_code": exit_code})
    return exit_code


def _supervise(
    start_worker: StartWorker, options: ServeOptions, stopping: Callable[[], bool]
) -> int:
    """Keep N workers up until ``stopping()``; drain them; the exit code."""
    slots = [_Slot(i, start_worker(i), time.monotonic()) for i in range(options.workers)]
    log.info(
        "supervisor started",
        extra={
            "workers": options.workers,
            "listen": options.listen,
            "http": options.http_listen,
            "server": options.server,
            "tls": options.tls is not None,
            "mtls": options.tls is not None and options.tls.client_ca is not None,
        },
    )
    exit_code = 0
    failed = False
    try:
        while not (failed or stopping()):
            time.sleep(0.2)
            for i, slot in enumerate(slots):
                if slot.process.is_alive() or stopping():
                    continue
                code = slot.process.exitcode or 0
                pid = slot.process.pid
                if pid is not None:
                    metrics.mark_worker_dead(pid)
                if time.monotonic() - slot.started < _STARTUP_WINDOW_SECONDS:
                    log.error(
                        "worker failed during startup; stopping",
                        extra={"worker": slot.index, "exit_code": code},
                    )
                    exit_code = code or 1
                    failed = True
                    break
                log.warning(
                    "worker exited; restarting", extra={"worker": slot.index, "exit_code": code}
                )
                slots[i] = _Slot(slot.index, start_worker(slot.index), time.monotonic())
    finally:
        _stop_workers(slots, options.grace_seconds)
    for slot in slots:
        if not _drained_cleanly(slot.process.exitcode) and exit_code == 0:
            exit_code = 1
    return exit_code


def _drained_cleanly(exitcode: int | None) -> bool:
    """Whether a worker's end after the drain request is a clean stop.

    Besides 0: killed by the drain's own SIGTERM. A worker dies of it only
    before its event loop handles SIGTERM, that is before it served a call
    (still importing or building its app: the race a loaded machine showed,
    a supervisor stopped two seconds after it started reported a failure),
    so nothing was lost. None is a worker that could not be reaped.
    """
    return exitcode is None or exitcode in (0, -signal.SIGTERM)


def _stop_workers(slots: list[_Slot], grace: float) -> None:
    for slot in slots:
        if slot.process.is_alive():
            slot.process.request_drain()
    deadline = time.monotonic() + grace + 5.0
    for slot in slots:
        slot.process.join(max(0.0, deadline - time.monotonic()))
        if slot.process.is_alive():
            log.error("worker did not drain in time; killing", extra={"worker": slot.index})
            slot.process.kill()
            slot.process.join(2.0)
        elif slot.process.exitcode == -signal.SIGTERM:
            log.info("worker stopped before it served", extra={"worker": slot.index})
