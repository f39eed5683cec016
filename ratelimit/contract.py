"""What other components may know of the rate-limit service: its snapshot contract.

The quota (RLQS) side adds how a gateway names a bucket
(:data:`QUOTA_DOMAIN_KEY`, :func:`quota_entry_key`) and the protocol's timings
(:class:`QuotaSettings`), which the compiler writes into the gateway's filter.

A ratelimit snapshot is a directory of envoyproxy/ratelimit YAML files (one
domain each) plus, when the cluster sets any, ``cluster-switches.json`` (the
counter store and failure mode). The management plane produces those files
and validates them here with the service's own loaders before publishing, so
it never sends what an instance would NACK; Redis URLs are checked with the
parser the service connects with. These names are the whole surface other
packages may import (an import-linter contract in ``pyproject.toml``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from meshplane.config_error import ConfigError
from ratelimit.config import RateLimitConfig, parse_domain
from ratelimit.quota.buckets import DOMAIN_KEY as QUOTA_DOMAIN_KEY
from ratelimit.quota.buckets import entry_key as quota_entry_key
from ratelimit.quota.service import QuotaSettings
from ratelimit.redis_url import RedisUrlError, parse_redis_url
from ratelimit.store.switches import SWITCHES_FILE, StoreSwitches, parse_switches

__all__ = [
    "QUOTA_DOMAIN_KEY",
    "SWITCHES_FILE",
    "QuotaSettings",
    "RateLimitConfig",
    "RedisUrlError",
    "StoreSwitches",
    "parse_config",
    "parse_redis_url",
    "quota_entry_key",
]

_DOMAIN_SUFFIXES = (".yaml", ".yml")


def parse_config(files: Mapping[str, bytes]) -> tuple[RateLimitConfig, StoreSwitches | None]:
    """Validate a snapshot (file name → content) as ``ratelimit serve --config DIR`` loads it.

    Secret references in the switches are checked for shape only: they are
    resolved on the service's host, where the Secrets are mounted. Raises
    :class:`ConfigError` naming the file, line and field.
    """
    domains = []
    switches: StoreSwitches | None = None
    for name in sorted(files):
        content = files[name]
        if name == SWITCHES_FILE:
            try:
                doc = json.loads(content)
            except ValueError as exc:
                raise ConfigError(f"unreadable: {exc}", source=name) from None
            switches = parse_switches(doc, name, resolve_refs=False)
        elif name.endswith(_DOMAIN_SUFFIXES) and not name.startswith("."):
            domains.append(parse_domain(content.decode("utf-8"), name))
        else:
            raise ConfigError("not a file a ratelimit snapshot may hold", source=name)
    return RateLimitConfig.of(domains), switches
