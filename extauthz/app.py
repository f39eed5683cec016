"""Wiring: config source + engine + remote JWKS + both adapters, as a GrpcApp.

One ``ExtAuthzApp`` runs per worker process. It loads the policy file, builds
the engine, fetches remote JWKS once before the server starts listening
(bounded by each source's timeout; a failure leaves that policy denying with
``no_keys`` until a background retry succeeds), then keeps these background
tasks: the policy-file watcher, the key-file watcher, one refresher per
remote JWKS, the reload applier and the metrics flusher.

On a config change the new engine is built and any *new* JWKS sources get
their first fetch before the swap, so a reload never makes requests fail
just because keys were not there yet. Remote sources are shared across
reloads when their settings are identical (no refetch storm on every edit);
sources no longer referenced are stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

from extauthz import grpc_api, metrics
from extauthz.config import ExtAuthzConfig, JwksUriConfig, load_config
from extauthz.decisions import DecisionRecorder
from extauthz.http_api import HttpCheckApp
from extauthz.jwks_remote import RemoteJwks
from extauthz.jwt_policy import Engine
from extauthz.keyring import RemoteKeys
from extauthz.service import AuthorizationService
from meshplane.config_error import ConfigError
from meshplane.config_source import FileSource, Fingerprint, fingerprint
from meshplane.decision_log import DecisionLog, DecisionLogSettings
from meshplane.server_contract import ASGIApp, WorkerContext
from meshplane.tracing import TraceSettings, Tracing, start_tracing

log = logging.getLogger(__name__)


class ExtAuthzApp:
    service_names: Sequence[str] = (grpc_api.SERVICE_NAME,)

    def __init__(
        self,
        config_path: str | Path,
        *,
        reload_interval: float = 1.0,
        clock: Callable[[], float] = time.time,
        decision_log: DecisionLogSettings | None = None,
        tracing: TraceSettings | None = None,
    ) -> None:
        self._decision_log = decision_log
        self._recorder: DecisionRecorder | None = None
        self._trace_settings = tracing
        self.tracing: Tracing | None = None
        self.source = FileSource(
            config_path, load_config, name="extauthz", interval=reload_interval
        )
        self._remotes: dict[JwksUriConfig, RemoteJwks] = {}
        self._remote_tasks: dict[JwksUriConfig, asyncio.Task[None]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._reload_lock = asyncio.Lock()
        self._reload_seq = 0
        config = self.source.load_initial()
        engine, self._initial_sources = self._build(config)
        self.service = AuthorizationService(engine, clock)
        self.http_app: ASGIApp | None = HttpCheckApp(self.service)

    def _build(self, config: ExtAuthzConfig) -> tuple[Engine, dict[JwksUriConfig, RemoteJwks]]:
        used: dict[JwksUriConfig, RemoteJwks] = {}

        def remote_for(uri_config: JwksUriConfig) -> RemoteKeys:
            remote = used.get(uri_config) or self._remotes.get(uri_config)
            if remote is None:
                remote = RemoteJwks(uri_config)
            used[uri_config] = remote
            return remote

        engine = Engine(config, remote_for)
        return engine, used

    async def _activate(self, used: dict[JwksUriConfig, RemoteJwks]) -> None:
        """First fetch for new sources, then keep every used source refreshed."""
        fresh = [remote for cfg, remote in used.items() if cfg not in self._remote_tasks]
        if fresh:
            await asyncio.gather(*(remote.refresh("initial") for remote in fresh))
        for cfg, remote in used.items():
            self._remotes[cfg] = remote
            if cfg not in self._remote_tasks:
                self._remote_tasks[cfg] = asyncio.create_task(remote.run())

    async def _retire(self, used: dict[JwksUriConfig, RemoteJwks]) -> None:
        for cfg in [cfg for cfg in self._remote_tasks if cfg not in used]:
            task = self._remote_tasks.pop(cfg)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            remote = self._remotes.pop(cfg)
            await remote.close()

    async def start(self, ctx: WorkerContext) -> None:
        if self._decision_log is not None and self._decision_log.enabled:
            self._recorder = DecisionRecorder(DecisionLog("extauthz", self._decision_log))
            if isinstance(self.http_app, HttpCheckApp):
                self.http_app.recorder = self._recorder  # the same lines in both modes
        self.tracing = start_tracing(self._trace_settings)
        grpc_api.register(self.service, ctx, self.tracing, self._recorder)
        await self._activate(self._initial_sources)
        self.source.add_listener(self._on_config)
        self._spawn(self.source.watch())
        self._spawn(self._watch_key_files())
        self._spawn(self._flush_metrics())
        # Move everything allocated at start-up (protobuf descriptors, crypto,
        # config) out of the collector's reach: full collections then scan
        # only what requests allocate, which keeps per-request CPU down.
        gc.collect()
        gc.freeze()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _watch_key_files(self) -> None:
        """Reload when a key file changes even though the policy file did not.

        Secrets are usually mounted separately from the policy (a Kubernetes
        Secret next to a ConfigMap), so rotating a PEM or HMAC file must take
        effect on its own. A reload that fails validation keeps the old keys.
        """
        watched = self.source.current
        prints = await asyncio.to_thread(_key_fingerprints, watched)
        while True:
            await asyncio.sleep(self.source.interval)
            config = self.source.current
            current = await asyncio.to_thread(_key_fingerprints, config)
            if config is not watched:  # the policy file itself reloaded
                watched, prints = config, current
                continue
            if current == prints:
                continue
            prints = current
            try:
                fresh = await asyncio.to_thread(load_config, self.source.path)
            except ConfigError as exc:
                log.error(
                    "key file reload rejected; keeping the last good keys",
                    extra={"error": str(exc)},
                )
                continue
            log.info("key files changed; reloading policies")
            self._on_config(fresh)

    async def _flush_metrics(self) -> None:
        """Publish the per-process check aggregate (see ``metrics``)."""
        while True:
            await asyncio.sleep(metrics.FLUSH_INTERVAL_SECONDS)
            try:
                metrics.flush()
            except Exception:
                log.exception("flushing check metrics failed")

    def _on_config(self, config: ExtAuthzConfig) -> None:
        self._reload_seq += 1
        self._spawn(self._apply(config, self._reload_seq))

    async def _apply(self, config: ExtAuthzConfig, seq: int) -> None:
        async with self._reload_lock:
            if seq != self._reload_seq:
                return  # a newer config arrived while we waited
            try:
                engine, used = self._build(config)
                await self._activate(used)
            except Exception:
                log.exception("applying reloaded config failed; keeping the previous one")
                return
            self.service.swap(engine)
            await self._retire(used)
            log.info("policies swapped", extra={"policies": sorted(config.policies)})

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._retire({})
        if self._recorder is not None:
            self._recorder.close()  # drain: write every queued decision line
        metrics.flush()
        if self.tracing is not None:  # export what is queued before the worker exits
            await asyncio.to_thread(self.tracing.shutdown)


def _key_fingerprints(config: ExtAuthzConfig) -> tuple[Fingerprint, ...]:
    return tuple(fingerprint(path) for path in config.key_files)


def make_app(
    config_path: str,
    reload_interval: float = 1.0,
    decision_log: DecisionLogSettings | None = None,
    tracing: TraceSettings | None = None,
) -> ExtAuthzApp:
    """Picklable app factory for ``meshplane.server.serve`` (a module-level function).

    ``reload_interval`` is short (0.1 s) under ``--control-plane``: the
    snapshot directory is swapped atomically, and propagation time is the
    product's promise.
    """
    return ExtAuthzApp(
        config_path, reload_interval=reload_interval, decision_log=decision_log, tracing=tracing
    )
