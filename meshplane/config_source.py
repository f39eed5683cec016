"""Validated, immutable config snapshots that are swapped live.

A service never blocks a request on a reload: requests read ``current``,
which is a single attribute holding an immutable snapshot, and the watcher
replaces it in one assignment. A snapshot that fails validation is counted
and logged, and the last good one stays live.

Files are polled rather than watched with inotify: polling sees Kubernetes
ConfigMap updates (an atomic swap of the ``..data`` symlink), works on every
filesystem, and costs a few ``stat`` calls a second.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Generic, TypeVar

from prometheus_client import Counter, Gauge

from meshplane.config_error import ConfigError

__all__ = ["ConfigError", "FileSource", "fingerprint", "resolve_once"]

log = logging.getLogger(__name__)

T = TypeVar("T")

CONFIG_RELOADS = Counter(
    "meshplane_config_reloads_total",
    "Config loads by config name and result (success or error).",
    ["config", "result"],
)
CONFIG_LAST_SUCCESS = Gauge(
    "meshplane_config_last_success_timestamp_seconds",
    "Unix time of the last config load that validated.",
    ["config"],
    multiprocess_mode="max",
)

_YAML_SUFFIXES = (".yaml", ".yml", ".json")

Fingerprint = tuple[tuple[str, str, int, int, int], ...]


def _stat_entry(path: Path) -> tuple[str, str, int, int, int]:
    real = os.path.realpath(path)
    st = os.stat(real)
    return (str(path), real, st.st_ino, st.st_mtime_ns, st.st_size)


def fingerprint(path: Path) -> Fingerprint:
    """What changes when the config at ``path`` changes.

    For a directory: every visible YAML file in it, with the real path it
    resolves to (so a symlink swap counts even if mtimes are equal).
    A missing path has the empty fingerprint.
    """
    try:
        if path.is_dir():
            entries = sorted(
                child
                for child in path.iterdir()
                if not child.name.startswith(".") and child.name.endswith(_YAML_SUFFIXES)
            )
            return (_stat_entry(path), *(_stat_entry(child) for child in entries))
        return (_stat_entry(path),)
    except OSError:
        return ()


def resolve_once(path: Path) -> Path:
    """The directory a symlink to a directory points at now; any other path as is.

    ``--control-plane`` services load ``cache/current``, a symlink the
    subscriber swaps to each new snapshot. A load that went through the link
    for each file (or once for the fingerprint and again for the files) could
    mix two snapshots, or find its directory pruned between two reads. So
    each load resolves the link once and reads only that directory. Other
    paths (a ConfigMap's file symlinks included) are left alone: relative key
    files in a config resolve against the path the operator gave.
    """
    try:
        if path.is_symlink() and path.is_dir():
            return Path(os.path.realpath(path))
    except OSError:
        pass
    return path


class FileSource(Generic[T]):
    """A config file or directory, loaded by ``loader`` and watched for changes."""

    def __init__(
        self,
        path: str | Path,
        loader: Callable[[Path], T],
        *,
        name: str,
        interval: float = 1.0,
    ) -> None:
        self.path = Path(path)
        self.name = name
        self.interval = interval
        self._loader = loader
        self._current: T | None = None
        self._fingerprint: Fingerprint = ()
        self._listeners: list[Callable[[T], None]] = []
        # Both results at 0 from the start: the first reload error is then an
        # increase() that dashboards and alerts see, not a series appearing.
        for result in ("success", "error"):
            CONFIG_RELOADS.labels(name, result)

    def load_initial(self) -> T:
        """Load the first snapshot; a ConfigError here should stop the start."""
        target = resolve_once(self.path)
        self._fingerprint = fingerprint(target)
        try:
            snapshot = self._loader(target)
        except ConfigError:
            CONFIG_RELOADS.labels(self.name, "error").inc()
            raise
        self._install(snapshot)
        return snapshot

    @property
    def current(self) -> T:
        if self._current is None:
            raise RuntimeError(f"config {self.name!r} used before load_initial()")
        return self._current

    def add_listener(self, fn: Callable[[T], None]) -> None:
        """Call ``fn(snapshot)`` after every successful swap."""
        self._listeners.append(fn)

    def _install(self, snapshot: T) -> None:
        self._current = snapshot
        CONFIG_RELOADS.labels(self.name, "success").inc()
        CONFIG_LAST_SUCCESS.labels(self.name).set(time.time())
        for listener in self._listeners:
            try:
                listener(snapshot)
            except Exception:
                log.exception("config listener failed", extra={"config": self.name})

    async def reload_if_changed(self) -> bool:
        """Reload when the files changed; return True if a new snapshot is live."""
        target = await asyncio.to_thread(resolve_once, self.path)
        current_fp = await asyncio.to_thread(fingerprint, target)
        if current_fp == self._fingerprint:
            return False
        self._fingerprint = current_fp
        try:
            snapshot = await asyncio.to_thread(self._loader, target)
        except ConfigError as exc:
            CONFIG_RELOADS.labels(self.name, "error").inc()
            log.error(
                "config reload rejected; keeping the last good config",
                extra={"config": self.name, "error": str(exc)},
            )
            return False
        except Exception as exc:
            CONFIG_RELOADS.labels(self.name, "error").inc()
            log.exception(
                "config reload failed; keeping the last good config",
                extra={"config": self.name, "error": repr(exc)},
            )
            return False
        self._install(snapshot)
        log.info("config reloaded", extra={"config": self.name, "path": str(self.path)})
        return True

    async def watch(self) -> None:
        """Poll forever; cancel the task to stop."""
        while True:
            await asyncio.sleep(self.interval)
            await self.reload_if_changed()
