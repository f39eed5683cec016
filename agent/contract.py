"""What the management plane and the agent agree on, besides the tunnel proto.

The management plane imports this module only (never the agent's adapters):
the token audience of the tunnel, the Envoy log levels, and the checks of
the fields a caller may set. Both ends run the checks: mgmt-api to answer a
bad request with 400 naming the field before anything crosses the tunnel,
the agent because it must not trust what arrives on it either.
"""

from __future__ import annotations

import re
from enum import IntEnum

# ``aud`` of the tokens an agent opens its tunnel with. The REST API refuses
# them (mgmt_api.auth.tokens), and so does the policy stream, so a token seen
# on one channel is no credential on another.
TUNNEL_AUDIENCE = "meshplane:agent-tunnel"

# Envoy's logger levels, as /logging names them.
LEVELS = ("trace", "debug", "info", "warning", "error", "critical", "off")
# Envoy's logger names are lower-case identifiers (``http``, ``ext_authz``, ``http2``).
LOGGER_NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
# ``resource`` is a repeated field name of the config dump
# (``dynamic_active_clusters``); ``mask`` a field mask (``cluster.name,cluster.type``).
RESOURCE = re.compile(r"^[a-z][a-z0-9_]{0,127}$")
MASK = re.compile(r"^[a-z][a-z0-9_.,]{0,511}$")
MAX_FILTER = 1024
MAX_LOGGERS = 200
# Kubernetes names: a namespace and workload are DNS-1123 labels, an
# instance (a pod name) a DNS-1123 subdomain.
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
MAX_TAIL_LINES = 100_000
# The inventory's pods: at most this many per namespace, and services per pod
# (mgmt-api refuses a report past them; the agent reports the first ones).
MAX_PODS_PER_NAMESPACE = 5000
MAX_POD_SERVICES = 32
# The service-account issuer's JWKS in a report (mgmt-api refuses a larger one).
MAX_JWKS_BYTES = 16 * 1024


class StatusCode(IntEnum):
    """The gRPC codes a diagnostics answer carries (numbers as in google.rpc.Code)."""

    OK = 0
    CANCELLED = 1
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    INTERNAL = 13
    UNAVAILABLE = 14


class FieldError(Exception):
    """A request field a caller got wrong: 400 naming ``field``.

    (Not a frozen dataclass: Python sets ``__traceback__`` on exceptions.)
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def check_workload(namespace: str, workload: str, instance: str) -> None:
    """Names shaped like Kubernetes names; raise FieldError naming the field."""
    for field, value, pattern, limit in (
        ("namespace", namespace, _LABEL, 63),
        ("workload", workload, _LABEL, 63),
    ):
        if not value:
            raise FieldError(field, "is required")
        if len(value) > limit or not pattern.match(value):
            raise FieldError(field, f"{value[:80]!r} is not a DNS-1123 label")
    if instance and (len(instance) > 253 or not _SUBDOMAIN.match(instance)):
        raise FieldError("instance", f"{instance[:80]!r} is not a DNS-1123 subdomain")


def check_level(level: str, field: str = "level") -> None:
    if level not in LEVELS:
        raise FieldError(field, f"{level[:40]!r} is not one of {', '.join(LEVELS)}")


def check_loggers(level: str, loggers: dict[str, str]) -> None:
    """Exactly one of ``level`` (every logger) and ``loggers`` (named ones)."""
    if bool(level) == bool(loggers):
        raise FieldError("level", "give either level (every logger) or loggers, not both")
    if level:
        check_level(level)
        return
    if len(loggers) > MAX_LOGGERS:
        raise FieldError("loggers", f"at most {MAX_LOGGERS} loggers at once")
    for name, value in loggers.items():
        if not LOGGER_NAME.match(name):
            raise FieldError("loggers", f"{name[:80]!r} is not a logger name")
        check_level(value, f"loggers.{name}")


def check_filter(pattern: str) -> None:
    """A regular expression Python compiles (Envoy's RE2 may still refuse it: 400 then too)."""
    if len(pattern) > MAX_FILTER:
        raise FieldError("filter", f"longer than {MAX_FILTER} characters")
    if any(ord(c) < 0x20 for c in pattern):
        raise FieldError("filter", "control characters are not allowed")
    try:
        re.compile(pattern)
    except re.error as exc:
        raise FieldError("filter", f"not a regular expression: {exc}") from None


def check_config_dump(resource: str, mask: str) -> None:
    if resource and not RESOURCE.match(resource):
        raise FieldError("resource", f"{resource[:80]!r} is not a config dump field name")
    if mask and not MASK.match(mask):
        raise FieldError("mask", f"{mask[:80]!r} is not a field mask (a.b,c.d)")


def check_stream(tail_lines: int | None, since_seconds: int | None) -> None:
    if tail_lines is not None and not 0 <= tail_lines <= MAX_TAIL_LINES:
        raise FieldError("tailLines", f"must be between 0 and {MAX_TAIL_LINES}")
    if since_seconds is not None and since_seconds < 1:
        raise FieldError("sinceSeconds", "must be at least 1")
