"""Decision logs: one JSON line per refused (or sampled) request, off the hot path.

Both Envoy-side services answer "why was this request refused?" with a
line an operator can find from the response alone: the caller gets an
``x-decision-id`` header, the same id is in the line, and the line carries
the W3C trace id so the trace is one more lookup away.

Split as the project's layers ask:

* pure logic (:func:`parse_traceparent`, :func:`mask`, :func:`sampled`,
  :func:`rfc3339`, :func:`new_decision_id`) takes its inputs (clock value,
  random draw, salt) as arguments, so it is table-tested;
* :class:`DecisionLog` is the adapter: a bounded queue drained by one
  daemon thread that writes lines (the keys of the services' JSON log
  format, :mod:`meshplane.logging`) to stderr or a file. The request path only
  appends to a deque; when the queue is full the line is dropped and counted
  in ``<service>_decision_log_dropped_total``, because a slow disk must never
  slow a Check. :meth:`DecisionLog.close` flushes what is queued (drain).

Masking: a principal or descriptor value is replaced by ``h:`` plus the first
16 hex digits of HMAC-SHA256 under a salt (per process unless configured), so
lines about one caller can be grouped without storing who it is. A line
builder queued by a service may hold request material until the writer runs
it, but what it returns (and so what is written or exported) is built by
that service's one redaction point from the fields named in :data:`FIELDS`.
"""

from __future__ import annotations

import argparse
import collections
import datetime as _dt
import enum
import hashlib
import hmac
import json
import logging
import os
import secrets
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any, TypeAlias

from prometheus_client import Counter

from meshplane import traceparent
from meshplane.decision_otlp import OtlpLogExporter
from meshplane.validate import Node

DECISION_ID_HEADER = "x-decision-id"
#: The response header every denial carries, at every proxy: ``<kind> <reason>``
#: (:func:`denied_value`), e.g. ``mode CUSTOM`` or ``extauthz path_not_allowed``.
DENIED_HEADER = "x-meshplane-denied"
#: ``logger`` and ``msg`` of every decision line, whoever writes it (a service's
#: :class:`DecisionLog` or a proxy's access log).
LOGGER = "meshplane.decisions"
MESSAGE = "decision"
#: The keys the services' JSON log format puts before a line's own fields.
ENVELOPE = ("ts", "level", "service", "pid", "logger", "msg")
MASK_PREFIX = "h:"
DEFAULT_QUEUE_LINES = 10_000
MAX_QUEUE_LINES = 1_000_000
DEFAULT_QUEUE_BYTES = 16 << 20  # request material held by queued line builders
MIN_SALT_BYTES = 16
MAX_FIELD_CHARS = 1024  # a path or value longer than this is cut: lines stay bounded

# The only keys a decision line may carry besides the formatter's own.
FIELDS = frozenset(
    {
        "decision_id",
        "trace_id",
        "time",
        "decision",
        "policy",
        "reason",
        "method",
        "path",
        "principal",
        "domain",
        "descriptors",
        "limit",
        "shadow",
        "kind",
        "rule",
        "peer",
        "principal_verified",
    }
)


class DenialKind(enum.StrEnum):
    """Who refused a request: the first word of :data:`DENIED_HEADER` and a line's ``kind``."""

    MODE = "mode"  # a sidecar's authorization mode (serviceAccounts included)
    JWT = "jwt"  # local JWT rules: the token is missing or does not verify
    RULES = "rules"  # local JWT rules: a verified token no rule allows
    EXTAUTHZ = "extauthz"  # an ExtAuthzPolicy (the service, or its check inside Envoy)
    RATELIMIT = "ratelimit"  # over a BackendTrafficPolicy's limit


def denied_value(kind: DenialKind, reason: str) -> str:
    """The :data:`DENIED_HEADER` value: the kind, a space, the reason code."""
    return f"{kind.value} {reason}"


def check_keys(keys: Iterable[str]) -> None:
    """Raise ValueError naming any key a decision line may not carry (for writers
    outside this module, such as a proxy's access-log format)."""
    unknown = sorted(set(keys) - FIELDS - set(ENVELOPE))
    if unknown:
        raise ValueError(f"not decision-line keys: {', '.join(unknown)}")


def parse_traceparent(value: str | None) -> str | None:
    """The trace id of a W3C ``traceparent`` header, or None when absent or invalid
    (the parser is :func:`meshplane.traceparent.parse`, shared with the tracing gate)."""
    parent = traceparent.parse(value)
    return None if parent is None else parent.trace_id


def mask(value: str, salt: bytes) -> str:
    """``h:`` + 16 hex digits of HMAC-SHA256(salt, value): groupable, not reversible."""
    digest = hmac.new(salt, value.encode("utf-8", "replace"), hashlib.sha256).hexdigest()
    return MASK_PREFIX + digest[:16]


def sampled(rate: float, draw: float) -> bool:
    """Whether a line with sample ``rate`` is kept, given a uniform ``draw`` in [0, 1)."""
    return rate > 0.0 and draw < rate


def rfc3339(now: float) -> str:
    """``now`` (seconds since the epoch) as RFC 3339 UTC with milliseconds."""
    moment = _dt.datetime.fromtimestamp(now, tz=_dt.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def new_decision_id() -> str:
    """128 random bits as 32 hex digits: unguessable and unique across workers."""
    return secrets.token_hex(16)


def clip(value: str) -> str:
    """``value`` cut to :data:`MAX_FIELD_CHARS` so one line stays bounded."""
    return value if len(value) <= MAX_FIELD_CHARS else value[:MAX_FIELD_CHARS] + "..."


@dataclass(frozen=True, slots=True)
class DecisionLogSettings:
    """Where and what to log; validated by the services' settings loaders."""

    path: str | None = None  # None: stderr
    allow_sample: float = 0.0
    show_principal: bool = False
    show_values: bool = False
    salt: bytes = field(default_factory=lambda: secrets.token_bytes(32), repr=False)
    queue_lines: int = DEFAULT_QUEUE_LINES
    queue_bytes: int = DEFAULT_QUEUE_BYTES
    enabled: bool = True
    otlp_endpoint: str | None = None  # HOST:PORT of an OTLP/gRPC logs receiver

    def shown(self, value: str, show: bool) -> str:
        """``value`` as the line shows it: clipped, and masked unless ``show``."""
        return clip(value) if show else mask(value, self.salt)


_DROPPED: dict[str, Counter] = {}
_BATCH_LINES = 512  # lines per OTLP export (and per wake-up of the writer)


def dropped_counter(service: str) -> Counter:
    """``<service>_decision_log_dropped_total{cause}``, declared once per process.

    ``cause`` is ``queue_full`` (the line never reached any sink) or
    ``export_failed`` (written locally, but the OTLP collector did not take it).
    """
    counter = _DROPPED.get(service)
    if counter is None:
        counter = _DROPPED[service] = Counter(
            f"{service}_decision_log_dropped",
            "Decision log lines dropped: writer queue full, or OTLP export failed",
            ["cause"],
        )
    return counter


Pending: TypeAlias = Mapping[str, Any] | Callable[[], Mapping[str, Any]]
_POLL_SECONDS = 0.05  # how often an idle writer looks at its queue


class DecisionLog:
    """A non-blocking writer of decision lines (see the module docstring).

    The queue is a bounded ``deque`` with one short lock for its line and
    byte counts and no condition to signal, so a request pays well under a
    microsecond for it. The writer thread polls every 50 ms (negligible when
    idle) and takes everything queued at once. A submitted item may be a
    callable that builds the line: the building (JSON, masking, parsing the
    trace header) then happens in the writer thread, off the request path.
    """

    def __init__(
        self, service: str, settings: DecisionLogSettings, *, stream: IO[str] | None = None
    ) -> None:
        self.settings = settings
        self._service = service
        dropped = dropped_counter(service)
        self._queue_full = dropped.labels("queue_full")
        self._export_failed = dropped.labels("export_failed")
        self._limit = settings.queue_lines
        self._queue: collections.deque[tuple[Pending, int]] = collections.deque()
        # Bytes held by queued items (request material a builder keeps until it
        # runs), so the queue is bounded in bytes too, not only in lines.
        self._byte_limit = settings.queue_bytes
        self._held = 0
        self._held_lock = threading.Lock()  # submit may run on several server threads
        self._stopping = threading.Event()
        self._exporter = (
            OtlpLogExporter(service, settings.otlp_endpoint) if settings.otlp_endpoint else None
        )
        self._file: IO[str] | None = None
        if settings.path is not None:
            self._file = open(settings.path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
        self._stream: IO[str] = self._file or stream or sys.stderr
        self._pid = os.getpid()
        self._thread = threading.Thread(target=self._run, name="decision-log", daemon=True)
        self._thread.start()

    def submit(self, line: Pending, size: int = 0) -> bool:
        """Queue one line (or its builder holding about ``size`` bytes of request
        material); never blocks. False (and counted) when the queue is full."""
        with self._held_lock:
            if len(self._queue) >= self._limit or self._held + size > self._byte_limit:
                full = True
            else:
                full = False
                self._held += size
                self._queue.append((line, size))
        if full:
            self._queue_full.inc()
        return not full

    def _run(self) -> None:
        """Take what is queued (in batches), write it, export it; until stopped and empty."""
        while True:
            stopping = self._stopping.wait(_POLL_SECONDS)
            while self._queue:
                self._write(self._take())
            if stopping:
                return

    def _take(self) -> list[Mapping[str, Any]]:
        batch: list[Mapping[str, Any]] = []
        queued = self._queue
        while queued and len(batch) < _BATCH_LINES:
            item, size = queued.popleft()
            with self._held_lock:
                self._held -= size
            try:
                batch.append(item() if callable(item) else item)
            except Exception:  # one bad line must not stop the writer
                logging.getLogger(__name__).exception("building a decision line failed")
        return batch

    def _render(self, line: Mapping[str, Any], ts: str) -> str:
        """One line in the services' log format (meshplane.logging's keys)."""
        entry: dict[str, Any] = {
            "ts": ts,
            "level": "info",
            "service": self._service,
            "pid": self._pid,
            "logger": LOGGER,
            "msg": MESSAGE,
        }
        entry.update(line)
        return json.dumps(entry, default=str, separators=(",", ":"))

    def _write(self, lines: list[Mapping[str, Any]]) -> None:
        if not lines:
            return
        # One write time per batch; each line's own decision time is its ``time``.
        ts = _dt.datetime.fromtimestamp(time.time(), tz=_dt.UTC).isoformat(timespec="milliseconds")
        try:
            self._stream.write("".join(self._render(line, ts) + "\n" for line in lines))
            self._stream.flush()
        except Exception:  # a full disk must not stop the writer
            logging.getLogger(__name__).exception("writing decision lines failed")
        if self._exporter is None:
            return
        try:
            self._exporter.export(lines)
        except Exception as exc:  # the message could quote the endpoint's answer: type only
            self._export_failed.inc(len(lines))
            logging.getLogger(__name__).warning(
                "OTLP export of decision lines failed", extra={"error": type(exc).__name__}
            )

    def close(self, timeout: float = 10.0) -> None:
        """Write (and export) what is queued, then stop the writer (called on drain)."""
        self._stopping.set()
        self._thread.join(timeout)
        if self._file is not None:
            self._file.close()
        if self._exporter is not None:
            self._exporter.close()


def add_arguments(parser: argparse.ArgumentParser, *, values_noun: str) -> None:
    """The decision-log flags every service's ``serve`` shares."""
    group = parser.add_argument_group("decision log")
    group.add_argument(
        "--decision-log",
        metavar="PATH",
        help="append decision lines to PATH (default: stderr); 'off' disables them",
    )
    group.add_argument(
        "--decision-log-allow-sample",
        type=float,
        metavar="RATE",
        help="fraction of allows also logged, 0..1 (default 0: denies only)",
    )
    group.add_argument(
        "--decision-log-show",
        action="store_true",
        default=None,
        help=f"log {values_noun} in clear instead of an HMAC-SHA256 hash",
    )
    group.add_argument(
        "--decision-log-salt-file",
        metavar="PATH",
        help="file holding the masking salt (default: random per process start)",
    )
    group.add_argument(
        "--decision-log-queue",
        type=int,
        metavar="LINES",
        help=f"lines queued before new ones are dropped (default {DEFAULT_QUEUE_LINES})",
    )
    group.add_argument(
        "--decision-log-otlp",
        metavar="HOST:PORT",
        help="also export decision lines as OTLP logs to this gRPC endpoint (plaintext)",
    )


def _check_rate(rate: float, where: str) -> None:
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"{where}: {rate} is not between 0 and 1")


def _check_queue(lines: int, where: str) -> None:
    if not 1 <= lines <= MAX_QUEUE_LINES:
        raise ValueError(f"{where}: {lines} is not between 1 and {MAX_QUEUE_LINES}")


def _check_endpoint(endpoint: str, where: str) -> None:
    host, _, port = endpoint.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{where}: {endpoint!r} is not HOST:PORT")


def _read_salt(path: str, where: str) -> bytes:
    try:
        salt = Path(path).read_bytes().strip()
    except OSError as exc:
        raise ValueError(f"{where}: cannot read ({exc.strerror})") from None
    if len(salt) < MIN_SALT_BYTES:
        raise ValueError(f"{where}: the salt must be at least {MIN_SALT_BYTES} bytes")
    return salt


def parse_section(node: Node) -> DecisionLogSettings:
    """The ``decisionLog`` section of a service's settings file (located errors).

    Keys: ``path`` (a file, ``-`` for stderr, ``off``), ``allowSample`` (0..1),
    ``show`` (log principals / descriptor values in clear), ``queueLines``,
    ``otlpEndpoint`` (HOST:PORT), ``saltFile``.
    """
    fields = node.fields(
        optional=("path", "allowSample", "show", "queueLines", "otlpEndpoint", "saltFile")
    )
    path_node = fields.optional("path")
    path = path_node.string() if path_node is not None else None
    otlp_node = fields.optional("otlpEndpoint")
    otlp = otlp_node.string(strip=True) if otlp_node is not None else None
    salt = secrets.token_bytes(32)
    try:
        if otlp is not None:
            _check_endpoint(otlp, "otlpEndpoint")
        salt_node = fields.optional("saltFile")
        if salt_node is not None:
            salt = _read_salt(salt_node.string(), "saltFile")
    except ValueError as exc:
        raise node.error(str(exc)) from None
    show = fields.boolean("show")
    return DecisionLogSettings(
        path=None if path in (None, "-", "off") else path,
        allow_sample=fields.number("allowSample", 0.0, lo=0.0, hi=1.0),
        show_principal=show,
        show_values=show,
        salt=salt,
        queue_lines=fields.integer("queueLines", DEFAULT_QUEUE_LINES, lo=1, hi=MAX_QUEUE_LINES),
        enabled=path != "off",
        otlp_endpoint=otlp,
    )


def settings_from_args(
    args: argparse.Namespace, base: DecisionLogSettings | None = None
) -> DecisionLogSettings:
    """:func:`add_arguments`' flags over ``base`` (a settings file's section, else
    the defaults); ValueError names the flag."""
    settings = base or DecisionLogSettings()
    changes: dict[str, Any] = {}
    if args.decision_log_allow_sample is not None:
        _check_rate(args.decision_log_allow_sample, "--decision-log-allow-sample")
        changes["allow_sample"] = args.decision_log_allow_sample
    if args.decision_log_queue is not None:
        _check_queue(args.decision_log_queue, "--decision-log-queue")
        changes["queue_lines"] = args.decision_log_queue
    if args.decision_log_salt_file:
        changes["salt"] = _read_salt(args.decision_log_salt_file, "--decision-log-salt-file")
    if args.decision_log_show:
        changes["show_principal"] = changes["show_values"] = True
    if args.decision_log_otlp is not None:
        _check_endpoint(args.decision_log_otlp, "--decision-log-otlp")
        changes["otlp_endpoint"] = args.decision_log_otlp
    path = args.decision_log
    if path is not None:
        changes["path"] = None if path in ("-", "off") else path
        changes["enabled"] = path != "off"
    return replace(settings, **changes)
