"""Subscribe to the management plane's policy stream and keep it on disk.

The subscriber is the client half of ``PolicyDistribution`` (see
``protos/meshplane/proto/distribution/v1/distribution.proto``). Every
snapshot it receives is written to a new directory, validated with the
service's own config loader (the same one ``--config`` uses), and only then
made live by atomically swapping the ``current`` symlink, exactly as the
kubelet swaps a ConfigMap. The workers watch ``current`` with
:class:`meshplane.config_source.FileSource`, so:

- static and streamed modes share one loader and one reload path;
- a rejected snapshot (NACK) never replaces the last good one;
- the last good snapshot survives a restart while the management plane is
  down, because it is simply the directory ``current`` points at.

Between snapshots the subscriber sends a keep-alive every
:data:`HEARTBEAT_SECONDS` (a request without ``response_nonce``), and both
ends ping the HTTP/2 connection, so the management plane can tell a live
instance from one that vanished without closing its stream.

A snapshot whose version is already on disk (the server re-sends the applied
version after a NACK, or a policy flips back) is never rewritten in place:
``current`` may point at that directory and workers may be reading it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import shutil
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import grpc
from prometheus_client.mmap_dict import MmapedDict, mmap_key

from meshplane.backoff import Backoff
from meshplane.config_error import ConfigError
from meshplane.distribution_contract import NodeIdentity
from meshplane.proto.distribution.v1 import distribution_pb2, distribution_pb2_grpc

log = logging.getLogger(__name__)

CURRENT = "current"
VERSION_FILE = ".version"
_KEEP_SNAPSHOTS = 3
# A keep-alive on the stream this often, so the management plane's status
# tells a live instance from one that is gone (its stale threshold, 60 s by
# default, is several of these).
HEARTBEAT_SECONDS = 10.0
# Ping the connection every 20 s and give up on it when a ping is not answered
# within 10 s, so a dead management plane (or a half-open NAT entry) is
# noticed and the subscriber reconnects. The server accepts pings every 10 s.
CHANNEL_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
)
# Codes that mean "your credentials are refused": retry at the longest backoff.
REFUSED = (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)


class SubscriberMetrics:
    """The subscriber's Prometheus metrics, in the supervisor's metrics directory.

    The subscriber runs in the supervisor, whose ``/metrics`` serves only the
    multiprocess directory (``PROMETHEUS_MULTIPROC_DIR``, set up by
    :func:`meshplane.metrics.prepare_multiprocess_dir` after this module was
    imported, so ordinary metric objects here would never be exported). So
    the subscriber writes its own small files there, in prometheus_client's
    format, rewriting them whole on every change:

    - ``meshplane_distribution_connected``: 1 while the stream is up;
    - ``meshplane_distribution_applied_info{kind, version}``: 1 for the
      version in force. Rewriting the file drops the previous version's
      series, which prometheus_client's multiprocess mode cannot remove, so
      there is exactly one such series per subscriber (bounded);
    - ``meshplane_distribution_snapshots_total{result}``: ack / nack counts.

    Nothing is written when the directory is not set (a subscriber used as a
    library, as in tests).
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.connected = False
        self.version = ""
        self.results = {"ack": 0, "nack": 0}
        self._lock = threading.Lock()

    def _write(self, path: Path, samples: list[tuple[str, dict[str, str], str, float]]) -> None:
        tmp = path.with_name(f".{path.name}.tmp")  # not *.db: the collector must not read it
        tmp.unlink(missing_ok=True)
        db = MmapedDict(str(tmp))  # type: ignore[no-untyped-call]
        try:
            for name, labels, help_text, value in samples:
                # The family of a counter is named without ``_total`` (prometheus_client
                # adds it back in the HELP/TYPE lines), else they say ``_total_total``.
                family = name.removesuffix("_total") if path.name.startswith("counter_") else name
                key = mmap_key(family, name, list(labels), list(labels.values()), help_text)
                db.write_value(key, value, 0.0)  # type: ignore[no-untyped-call]
        finally:
            db.close()  # type: ignore[no-untyped-call]
        os.replace(tmp, path)

    def publish(self) -> None:
        directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        if not directory:
            return
        base = Path(directory)
        pid = os.getpid()
        with self._lock:
            gauges: list[tuple[str, dict[str, str], str, float]] = [
                (
                    "meshplane_distribution_connected",
                    {},
                    "1 while the policy stream to the management plane is up.",
                    1.0 if self.connected else 0.0,
                )
            ]
            if self.version:
                gauges.append(
                    (
                        "meshplane_distribution_applied_info",
                        {"kind": self.kind, "version": self.version},
                        "The policy snapshot version in force (value 1).",
                        1.0,
                    )
                )
            counters = [
                (
                    "meshplane_distribution_snapshots_total",
                    {"result": result},
                    "Snapshots received from the management plane, by result (ack or nack).",
                    float(count),
                )
                for result, count in sorted(self.results.items())
            ]
            try:
                # File names: prometheus_client reads type (and gauge mode) from them.
                self._write(base / f"gauge_max_subscriber-{pid}.db", gauges)
                self._write(base / f"counter_subscriber-{pid}.db", counters)
            except OSError as exc:  # the directory went away (shutting down)
                log.debug("cannot write subscriber metrics", extra={"error": str(exc)})

    def set(self, *, connected: bool | None = None, version: str | None = None) -> None:
        with self._lock:
            if connected is not None:
                self.connected = connected
            if version is not None:
                self.version = version
        self.publish()

    def count(self, result: str) -> None:
        with self._lock:
            self.results[result] += 1
        self.publish()


def current_dir(cache_dir: Path) -> Path:
    """The path services load: a symlink to the last good snapshot."""
    return cache_dir / CURRENT


def ensure_cache(cache_dir: Path) -> Path:
    """Make sure ``current`` exists; before any snapshot it is an empty dir.

    An empty directory is a valid config for every service (no policies), so
    a first start with the management plane down serves, by each service's
    own rules for "no policy", instead of crash-looping.
    """
    (cache_dir / "snapshots").mkdir(parents=True, exist_ok=True)
    target = current_dir(cache_dir)
    if not target.exists():
        empty = cache_dir / "snapshots" / "empty"
        empty.mkdir(exist_ok=True)
        _swap_symlink(target, Path("snapshots") / "empty")
    return target


def _swap_symlink(link: Path, target: Path) -> None:
    tmp = link.with_name(f".{link.name}.{os.getpid()}.tmp")
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    tmp.symlink_to(target)
    os.replace(tmp, link)


def _read_version(directory: Path) -> str:
    try:
        return (directory / VERSION_FILE).read_text().strip()
    except OSError:
        return ""


def _safe_name(name: str) -> str:
    base = os.path.basename(name)
    if not base or base != name or base.startswith("."):
        raise ConfigError(f"snapshot file name {name!r} is not a plain file name")
    return base


class SnapshotSubscriber:
    """Keeps ``cache_dir/current`` equal to the newest valid snapshot."""

    def __init__(
        self,
        address: str,
        node: NodeIdentity,
        loader: Callable[[Path], object],
        cache_dir: Path,
        *,
        credentials: Callable[[], str] | None = None,
        channel_credentials: grpc.ChannelCredentials | None = None,
        on_applied: Callable[[str], None] | None = None,
        max_backoff: float = 15.0,
        heartbeat: float = HEARTBEAT_SECONDS,
        channel_options: tuple[tuple[str, int], ...] = CHANNEL_OPTIONS,
    ) -> None:
        self.address = address
        self.node = node
        self.loader = loader
        self.cache_dir = cache_dir
        self.credentials = credentials
        self.channel_credentials = channel_credentials
        self.on_applied = on_applied
        self.max_backoff = max_backoff
        self.heartbeat = heartbeat
        self.channel_options = channel_options
        ensure_cache(cache_dir)
        self.applied_version = self._read_applied_version()
        self.metrics = SubscriberMetrics(node.kind)
        self.metrics.set(version=self.applied_version)

    def _read_applied_version(self) -> str:
        return _read_version(current_dir(self.cache_dir))

    def apply(self, snapshot: distribution_pb2.Snapshot) -> str | None:
        """Validate and install one snapshot; return an error message or None.

        The version is a digest of the content, so a directory already
        holding this version holds this content: it is validated and made
        current as it is, never deleted and rewritten (``current`` may point
        at it, and a worker may be loading it right now).
        """
        digest = hashlib.sha256(snapshot.version_info.encode()).hexdigest()[:16]
        final = self.cache_dir / "snapshots" / digest
        if _read_version(final) == snapshot.version_info:
            return self._reuse(final, snapshot.version_info)
        staging = self.cache_dir / "snapshots" / f".staging-{digest}-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        try:
            for file in snapshot.files:
                (staging / _safe_name(file.name)).write_bytes(file.content)
            (staging / VERSION_FILE).write_text(snapshot.version_info + "\n")
            self.loader(staging)
        except ConfigError as exc:
            shutil.rmtree(staging, ignore_errors=True)
            return str(exc)
        except Exception as exc:
            shutil.rmtree(staging, ignore_errors=True)
            log.exception("snapshot loader crashed")
            return f"loader failed: {exc!r}"
        if final.exists():
            # Same digest, other version (never in practice): the directory is
            # not in use by ``current`` (its version differs), so replace it.
            shutil.rmtree(final, ignore_errors=True)
        os.replace(staging, final)
        _swap_symlink(current_dir(self.cache_dir), Path("snapshots") / digest)
        self.applied_version = snapshot.version_info
        self._prune(keep=final.name)
        return None

    def _reuse(self, final: Path, version: str) -> str | None:
        """Make an already installed snapshot current again, without rewriting it."""
        try:
            self.loader(final)
        except ConfigError as exc:
            return str(exc)
        except Exception as exc:
            log.exception("snapshot loader crashed")
            return f"loader failed: {exc!r}"
        if os.path.realpath(current_dir(self.cache_dir)) != os.path.realpath(final):
            _swap_symlink(current_dir(self.cache_dir), Path("snapshots") / final.name)
        os.utime(final)  # newest again, so pruning keeps it
        self.applied_version = version
        self._prune(keep=final.name)
        return None

    def _prune(self, keep: str) -> None:
        snapshots = sorted(
            (p for p in (self.cache_dir / "snapshots").iterdir() if not p.name.startswith(".")),
            key=lambda p: p.stat().st_mtime,
            reverse=True,
        )
        for old in snapshots[_KEEP_SNAPSHOTS:]:
            if old.name not in (keep, "empty"):
                shutil.rmtree(old, ignore_errors=True)

    async def _requests(
        self, queue: asyncio.Queue[distribution_pb2.SnapshotRequest]
    ) -> AsyncIterator[distribution_pb2.SnapshotRequest]:
        while True:
            yield await queue.get()

    async def _keepalive(self, queue: asyncio.Queue[distribution_pb2.SnapshotRequest]) -> None:
        """Every ``heartbeat`` seconds: the version in force, answering no snapshot."""
        while True:
            await asyncio.sleep(self.heartbeat)
            queue.put_nowait(distribution_pb2.SnapshotRequest(version_info=self.applied_version))
            self.metrics.publish()  # also rewrites files a supervisor restart of the dir removed

    async def run_once(self) -> None:
        """One stream: subscribe, then apply and answer snapshots until it ends."""
        metadata: list[tuple[str, str]] = []
        if self.credentials is not None:
            metadata.append(("authorization", f"Bearer {self.credentials()}"))
        options = list(self.channel_options)
        if self.channel_credentials is not None:
            channel = grpc.aio.secure_channel(self.address, self.channel_credentials, options)
        else:
            channel = grpc.aio.insecure_channel(self.address, options)
        async with channel:
            stub = distribution_pb2_grpc.PolicyDistributionStub(channel)  # type: ignore[no-untyped-call]
            queue: asyncio.Queue[distribution_pb2.SnapshotRequest] = asyncio.Queue()
            queue.put_nowait(
                distribution_pb2.SnapshotRequest(
                    node=self.node.to_proto(), version_info=self.applied_version
                )
            )
            call = stub.StreamSnapshots(self._requests(queue), metadata=metadata)
            keepalive = asyncio.create_task(self._keepalive(queue))
            try:
                # The server sends its headers once the stream is admitted;
                # a refused stream ends instead (the loop below raises).
                await call.initial_metadata()
                if not call.done():
                    self.metrics.set(connected=True)
                async for snapshot in call:
                    error = await asyncio.to_thread(self.apply, snapshot)
                    if error is None:
                        self.metrics.count("ack")
                        self.metrics.set(version=self.applied_version)
                        log.info("snapshot applied", extra={"version": snapshot.version_info})
                        if self.on_applied is not None:
                            self.on_applied(snapshot.version_info)
                        queue.put_nowait(
                            distribution_pb2.SnapshotRequest(
                                version_info=snapshot.version_info, response_nonce=snapshot.nonce
                            )
                        )
                    else:
                        self.metrics.count("nack")
                        log.error(
                            "snapshot rejected; keeping the last good one",
                            extra={"version": snapshot.version_info, "error": error},
                        )
                        queue.put_nowait(
                            distribution_pb2.SnapshotRequest(
                                version_info=self.applied_version,
                                response_nonce=snapshot.nonce,
                                error_detail=distribution_pb2.ErrorDetail(message=error),
                            )
                        )
            finally:
                keepalive.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await keepalive
                self.metrics.set(connected=False)
                call.cancel()

    async def run(self) -> None:
        """Stay subscribed forever, reconnecting with jittered backoff."""
        backoff = Backoff(self.max_backoff)
        while True:
            failure: grpc.aio.AioRpcError | None = None
            try:
                await self.run_once()
                backoff.reset()  # the server ended the stream cleanly
            except grpc.aio.AioRpcError as exc:
                failure = exc
                if exc.code() in REFUSED:
                    backoff.refused()
            wait = backoff.next_wait()
            if failure is not None:
                log.warning(
                    "policy stream failed; retrying",
                    extra={
                        "code": failure.code().name,
                        "detail": failure.details(),
                        "retry_in": round(wait, 2),
                    },
                )
            await asyncio.sleep(wait)
