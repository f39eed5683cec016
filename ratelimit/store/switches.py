"""The cluster's rate-limit switches, as delivered in a ratelimit snapshot.

The management plane adds ``cluster-switches.json`` (:data:`SWITCHES_FILE`)
to a cluster's ratelimit snapshot when the cluster sets ``rateLimit``
(``POST .../clusters/{c}/config`` returns the same object)::

    {"rateLimit": {"redis": {"disabled": true}}}
    {"rateLimit": {"backend": {"type": "Redis", "redis": {"url": "redis://r:6379/0"}},
                   "failureMode": "deny"}}
    {"rateLimit": {"backend": {"redis": {"urlRef": {"name": "rl", "namespace": "mesh"},
                                         "tls": {"certificateRef": {"name": "rl-ca"}}}}}}

References are resolved here, on the service's host, from a mounted
directory (:data:`SECRETS_DIR_ENV`, default :data:`DEFAULT_SECRETS_DIR`):
``urlRef`` reads ``<dir>/<namespace>/<name>/url`` and ``certificateRef``
uses ``<dir>/<namespace>/<name>/ca.crt`` (namespace ``default`` when
omitted), exactly where a Kubernetes Secret mounted at ``<dir>/<ns>/<name>``
puts its keys. So a URL with its password is never stored in, nor sent by,
the management plane. A switch that cannot be resolved is a
:class:`ConfigError`: the subscriber NACKs the snapshot and keeps the last
good one.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlencode, urlsplit, urlunsplit

from meshplane.config_error import ConfigError
from ratelimit.redis_url import RedisUrlError, parse_redis_url
from ratelimit.settings import FAILURE_MODES, FailureMode

SWITCHES_FILE = "cluster-switches.json"
SECRETS_DIR_ENV = "MESHPLANE_SECRETS_DIR"
DEFAULT_SECRETS_DIR = "/var/run/secrets/meshplane"


@dataclass(frozen=True)
class StoreSwitches:
    """What the cluster asks for. ``store_set`` False: it says nothing about the store."""

    store_set: bool = False
    redis_url: str | None = field(default=None, repr=False)  # None: in memory
    failure_mode: FailureMode | None = None
    store_source: str = ""  # for logs: never the URL itself


def secrets_dir() -> Path:
    return Path(os.environ.get(SECRETS_DIR_ENV) or DEFAULT_SECRETS_DIR)


def _secret_file(ref: Any, key: str, field_name: str, source: str, *, resolve: bool) -> Path | None:
    """The mounted file a reference names; None when not resolving (a shape check only)."""
    if not isinstance(ref, dict) or not isinstance(ref.get("name"), str) or not ref["name"]:
        raise ConfigError("needs a name", source=source, field=field_name)
    namespace, name = str(ref.get("namespace") or "default"), str(ref["name"])
    for part in (namespace, name):
        if "/" in part or part.startswith("."):
            raise ConfigError(f"{part!r} is not a plain name", source=source, field=field_name)
    if not resolve:
        return None
    path = secrets_dir() / namespace / name / key
    if not path.is_file():
        raise ConfigError(
            f"secret {namespace}/{name} has no {key!r} under {secrets_dir()}",
            source=source,
            field=field_name,
        )
    return path


def _redis_url(redis: dict[str, Any], source: str, *, resolve: bool) -> tuple[str | None, str]:
    """(url, description) from ``backend.redis``; the URL is None for an unresolved urlRef."""
    prefix = "rateLimit.backend.redis"
    url: str | None
    if "url" in redis:
        url, described = str(redis["url"]), "backend.redis.url"
    elif "urlRef" in redis:
        ref_path = _secret_file(redis["urlRef"], "url", f"{prefix}.urlRef", source, resolve=resolve)
        url, described = None, "backend.redis.urlRef"
        if ref_path is not None:
            url = ref_path.read_text(encoding="utf-8").strip()
            described += f" {ref_path.parent.parent.name}/{ref_path.parent.name}"
    else:
        raise ConfigError("give url or urlRef", source=source, field=prefix)
    cert_ref = (redis.get("tls") or {}).get("certificateRef")
    if cert_ref is not None:
        ca = _secret_file(
            cert_ref, "ca.crt", f"{prefix}.tls.certificateRef", source, resolve=resolve
        )
        if url is None:
            return url, described
        try:
            # First: its errors are the ones safe to show.
            uses_tls = parse_redis_url(url).tls
            parts = urlsplit(url)
        except ValueError as exc:  # RedisUrlError included
            # Neither message may echo the URL: it may hold a password.
            message = str(exc) if isinstance(exc, RedisUrlError) else "not a valid URL"
            raise ConfigError(message, source=source, field=prefix) from None
        if not uses_tls:
            raise ConfigError(
                "a TLS certificate needs a TLS URL "
                "(rediss://, rediss+sentinel:// or rediss+cluster://)",
                source=source,
                field=prefix,
            )
        if ca is not None:
            query = "&".join(q for q in (parts.query, urlencode({"ssl_ca_certs": str(ca)})) if q)
            url = urlunsplit(parts._replace(query=query))
    if url is None:
        return url, described
    try:
        parse_redis_url(url)
    except RedisUrlError as exc:
        # The message never echoes the URL: it may hold a password.
        raise ConfigError(str(exc), source=source, field=prefix) from None
    return url, described


def parse_switches(
    doc: Any, source: str = SWITCHES_FILE, *, resolve_refs: bool = True
) -> StoreSwitches:
    """Validate ``{"rateLimit": {...}}`` and resolve its references.

    ``resolve_refs=False`` checks everything but whether the referenced
    Secrets are mounted (they are mounted where the service runs, not where
    the management plane validates): ``redis_url`` is then None for a
    ``urlRef``.
    """
    if not isinstance(doc, dict) or not isinstance(doc.get("rateLimit", {}), dict):
        raise ConfigError("must be an object with a rateLimit object", source=source)
    rate_limit: dict[str, Any] = doc.get("rateLimit") or {}
    mode = rate_limit.get("failureMode")
    if mode is not None and mode not in FAILURE_MODES:
        raise ConfigError(
            "must be one of " + ", ".join(FAILURE_MODES),
            source=source,
            field="rateLimit.failureMode",
        )
    failure_mode = cast(FailureMode | None, mode)
    if (rate_limit.get("redis") or {}).get("disabled"):
        return StoreSwitches(True, None, failure_mode, "redis.disabled (in memory)")
    redis = (rate_limit.get("backend") or {}).get("redis")
    if redis is None:
        return StoreSwitches(False, None, failure_mode)
    url, described = _redis_url(redis, source, resolve=resolve_refs)
    return StoreSwitches(True, url, failure_mode, described)


def load_switches(directory: Path) -> StoreSwitches | None:
    """The switches in a snapshot directory; None when it carries none."""
    path = directory / SWITCHES_FILE
    if not directory.is_dir() or not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"unreadable: {exc}", source=str(path)) from None
    return parse_switches(doc, str(path))
