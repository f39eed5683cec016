"""Check Envoy configuration by parsing it into Envoy's own protos (``xds-protos``).

Docker and Envoy cannot run here, so every Envoy config the project ships or
renders is checked this way instead: ``json_format`` with unknown fields
rejected, and every ``"@type"`` Any resolved against the registered message
types, so a misspelt field or a typed config of the wrong type fails the test.

``descriptors_for`` mirrors what Envoy's rate-limit actions produce for a
request, for the action kinds the project renders, so tests can check route
actions against a rate-limit service config without a running Envoy.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml
from envoy.config.bootstrap.v3 import bootstrap_pb2
from envoy.config.route.v3 import route_components_pb2

# Imported for their side effect: registering the typed_config message types
# so that json_format can resolve every "@type" Any.
from envoy.extensions.access_loggers.filters.cel.v3 import cel_pb2  # noqa: F401
from envoy.extensions.access_loggers.stream.v3 import stream_pb2  # noqa: F401
from envoy.extensions.filters.http.ext_authz.v3 import ext_authz_pb2  # noqa: F401
from envoy.extensions.filters.http.jwt_authn.v3 import config_pb2  # noqa: F401
from envoy.extensions.filters.http.lua.v3 import lua_pb2  # noqa: F401
from envoy.extensions.filters.http.ratelimit.v3 import rate_limit_pb2  # noqa: F401
from envoy.extensions.filters.http.router.v3 import router_pb2  # noqa: F401
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2,
)
from envoy.extensions.upstreams.http.v3 import http_protocol_options_pb2  # noqa: F401
from google.protobuf import any_pb2, json_format
from google.protobuf.message import Message

M = TypeVar("M", bound=Message)

Entries = list[tuple[str, str]]


def parse(doc: Mapping[str, Any], message: M) -> M:
    """``doc`` (protojson or YAML-as-dict) into ``message``; unknown fields fail."""
    return json_format.ParseDict(dict(doc), message, ignore_unknown_fields=False)


def parse_bootstrap(source: Path | Mapping[str, Any]) -> bootstrap_pb2.Bootstrap:
    """A bootstrap file (or its loaded dict) as Envoy's Bootstrap proto."""
    doc = yaml.safe_load(source.read_text()) if isinstance(source, Path) else source
    return parse(doc, bootstrap_pb2.Bootstrap())


def parse_typed(doc: Mapping[str, Any], message: M) -> M:
    """A typed config with its ``"@type"``: checks the type URL names ``message``'s type."""
    any_message = parse(doc, any_pb2.Any())
    assert any_message.Unpack(message), (any_message.type_url, message.DESCRIPTOR.full_name)
    return message


def unpack(any_message: any_pb2.Any, message: M) -> M:
    assert any_message.Unpack(message), (any_message.type_url, message.DESCRIPTOR.full_name)
    return message


def listener_hcm(
    bootstrap: bootstrap_pb2.Bootstrap, listener: str | None = None
) -> http_connection_manager_pb2.HttpConnectionManager:
    """The HTTP connection manager of a listener (the first one by default)."""
    listeners = bootstrap.static_resources.listeners
    chosen = listeners[0] if listener is None else next(x for x in listeners if x.name == listener)
    return unpack(
        chosen.filter_chains[0].filters[0].typed_config,
        http_connection_manager_pb2.HttpConnectionManager(),
    )


def _header_matches(matcher: Any, headers: Mapping[str, str]) -> bool:
    value = headers.get(matcher.name)
    invert = bool(matcher.invert_match)
    if value is None:
        return invert
    kind = matcher.string_match.WhichOneof("match_pattern")
    if kind == "exact":
        found = bool(value == matcher.string_match.exact)
    elif kind == "safe_regex":
        found = re.fullmatch(matcher.string_match.safe_regex.regex, value) is not None
    else:  # pragma: no cover - only the kinds the project renders
        raise AssertionError(f"unexpected string match {kind}")
    return found != invert


def _masked(client_ip: str, action: Any) -> str:
    address = ipaddress.ip_address(client_ip)
    if address.version == 4:
        length = action.v4_prefix_mask_len.value if action.HasField("v4_prefix_mask_len") else 32
    else:
        length = action.v6_prefix_mask_len.value if action.HasField("v6_prefix_mask_len") else 128
    return str(ipaddress.ip_network(f"{client_ip}/{length}", strict=False))


def descriptor_of(
    rate_limit: route_components_pb2.RateLimit, headers: Mapping[str, str], client_ip: str
) -> Entries | None:
    """The descriptor Envoy sends for one ``RateLimit``, or None when an action
    cannot produce its entry (a missing header, a header match that fails)."""
    entries: Entries = []
    for action in rate_limit.actions:
        kind = action.WhichOneof("action_specifier")
        if kind == "generic_key":
            key = action.generic_key.descriptor_key or "generic_key"
            entries.append((key, action.generic_key.descriptor_value))
        elif kind == "request_headers":
            value = headers.get(action.request_headers.header_name)
            if value is None:
                return None
            entries.append((action.request_headers.descriptor_key, value))
        elif kind == "remote_address":
            entries.append(("remote_address", client_ip))
        elif kind == "masked_remote_address":
            entries.append(
                ("masked_remote_address", _masked(client_ip, action.masked_remote_address))
            )
        elif kind == "header_value_match":
            match = action.header_value_match
            expect = match.expect_match.value if match.HasField("expect_match") else True
            if all(_header_matches(h, headers) for h in match.headers) != expect:
                return None
            entries.append((match.descriptor_key or "header_match", match.descriptor_value))
        else:  # pragma: no cover - only the kinds the project renders
            raise AssertionError(f"unexpected action {kind}")
    return entries


def descriptors_for(
    rate_limits: Iterable[route_components_pb2.RateLimit],
    headers: Mapping[str, str],
    client_ip: str,
) -> list[Entries]:
    """What Envoy sends for a request: one entry list per rate limit that applies."""
    out = []
    for rate_limit in rate_limits:
        entries = descriptor_of(rate_limit, headers, client_ip)
        if entries:
            out.append(entries)
    return out
