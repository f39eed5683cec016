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
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import random
import shutil
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
from prometheus_client import Counter, Gauge

from meshplane.config_error import ConfigError
from meshplane.proto.distribution.v1 import distribution_pb2, distribution_pb2_grpc

log = logging.getLogger(__name__)

SNAPSHOTS = Counter(
    "meshplane_distribution_snapshots_total",
    "Snapshots received from the management plane, by result (ack or nack).",
    ["result"],
)
CONNECTED = Gauge(
    "meshplane_distribution_connected",
    "1 while the policy stream to the management plane is up.",
    multiprocess_mode="max",
)

CURRENT = "current"
_KEEP_SNAPSHOTS = 3


@dataclass(frozen=True)
class NodeIdentity:
    """Who subscribes: the service kind, its cluster and this instance."""

    kind: str
    organization: str
    cluster: str
    instance: str

    def to_proto(self) -> distribution_pb2.Node:
        return distribution_pb2.Node(
            kind=self.kind,
            organization=self.organization,
            cluster=self.cluster,
            instance=self.instance,
        )


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
    ) -> None:
        self.address = address
        self.node = node
        self.loader = loader
        self.cache_dir = cache_dir
        self.credentials = credentials
        self.channel_credentials = channel_credentials
        self.on_applied = on_applied
        self.max_backoff = max_backoff
        ensure_cache(cache_dir)
        self.applied_version = self._read_applied_version()

    def _read_applied_version(self) -> str:
        version_file = current_dir(self.cache_dir) / ".version"
        try:
            return version_file.read_text().strip()
        except OSError:
            return ""

    def apply(self, snapshot: distribution_pb2.Snapshot) -> str | None:
        """Validate and install one snapshot; return an error message or None."""
        digest = hashlib.sha256(snapshot.version_info.encode()).hexdigest()[:16]
        staging = self.cache_dir / "snapshots" / f".staging-{digest}-{os.getpid()}"
        final = self.cache_dir / "snapshots" / digest
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        try:
            for file in snapshot.files:
                (staging / _safe_name(file.name)).write_bytes(file.content)
            (staging / ".version").write_text(snapshot.version_info + "\n")
            self.loader(staging)
        except ConfigError as exc:
            shutil.rmtree(staging, ignore_errors=True)
            return str(exc)
        except Exception as exc:
            shutil.rmtree(staging, ignore_errors=True)
            log.exception("snapshot loader crashed")
            return f"loader failed: {exc!r}"
        shutil.rmtree(final, ignore_errors=True)
        os.replace(staging, final)
        _swap_symlink(current_dir(self.cache_dir), Path("snapshots") / digest)
        self.applied_version = snapshot.version_info
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

    async def run_once(self) -> None:
        """One stream: subscribe, then apply and answer snapshots until it ends."""
        metadata: list[tuple[str, str]] = []
        if self.credentials is not None:
            metadata.append(("authorization", f"Bearer {self.credentials()}"))
        if self.channel_credentials is not None:
            channel = grpc.aio.secure_channel(self.address, self.channel_credentials)
        else:
            channel = grpc.aio.insecure_channel(self.address)
        async with channel:
            stub = distribution_pb2_grpc.PolicyDistributionStub(channel)  # type: ignore[no-untyped-call]
            queue: asyncio.Queue[distribution_pb2.SnapshotRequest] = asyncio.Queue()
            queue.put_nowait(
                distribution_pb2.SnapshotRequest(
                    node=self.node.to_proto(), version_info=self.applied_version
                )
            )
            call = stub.StreamSnapshots(self._requests(queue), metadata=metadata)
            CONNECTED.set(1)
            try:
                async for snapshot in call:
                    error = await asyncio.to_thread(self.apply, snapshot)
                    if error is None:
                        SNAPSHOTS.labels("ack").inc()
                        log.info("snapshot applied", extra={"version": snapshot.version_info})
                        if self.on_applied is not None:
                            self.on_applied(snapshot.version_info)
                        queue.put_nowait(
                            distribution_pb2.SnapshotRequest(
                                version_info=snapshot.version_info, response_nonce=snapshot.nonce
                            )
                        )
                    else:
                        SNAPSHOTS.labels("nack").inc()
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
                CONNECTED.set(0)
                call.cancel()

    async def run(self) -> None:
        """Stay subscribed forever, reconnecting with jittered backoff."""
        backoff = 0.25
        while True:
            try:
                await self.run_once()
                backoff = 0.25  # the server ended the stream cleanly
            except grpc.aio.AioRpcError as exc:
                log.warning(
                    "policy stream failed; retrying",
                    extra={
                        "code": exc.code().name,
                        "detail": exc.details(),
                        "retry_in": round(backoff, 2),
                    },
                )
                if exc.code() == grpc.StatusCode.UNAUTHENTICATED:
                    backoff = self.max_backoff
            await asyncio.sleep(backoff * random.uniform(0.8, 1.2))  # noqa: S311 - jitter
            backoff = min(backoff * 2, self.max_backoff)
