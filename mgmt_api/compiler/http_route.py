"""The routes a cluster's gateways serve: Gateway API ``HTTPRoute`` and Envoy Gateway ``Backend``.

A gateway Envoy configured over ADS (:mod:`mgmt_api.compiler.gateway_xds`)
needs to know which paths go to which upstream; BackendTrafficPolicies
(``targetRef`` an ``HTTPRoute``) and SecuritySettings (the route's namespace)
then say what is enforced on each. The shapes are the subset of the Gateway
API (``gateway.networking.k8s.io/v1``) and of Envoy Gateway's ``Backend``
(``gateway.envoyproxy.io/v1alpha1``) the gateway renders, so a manifest
written for Envoy Gateway applies unchanged when it stays inside it:

- ``HTTPRoute.spec``: ``parentRefs`` (the gateways it attaches to, by name;
  none = every gateway of the cluster), ``hostnames`` (none = any host), and
  ``rules``, each with ``matches`` (``path`` of type ``PathPrefix`` or
  ``Exact``; none = every path) and ``backendRefs`` (a ``Service``, reached as
  ``{name}.{namespace}.svc.cluster.local:{port}``, or a ``Backend``, with an
  optional ``weight``);
- ``Backend.spec.endpoints``: ``ip: {address, port}`` or ``fqdn: {hostname, port}``.

Numbers are strict (``port: "80"`` is refused naming the field), as in
:mod:`mgmt_api.compiler.traffic_policy`; the REST kinds store this model's dump.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Final, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator, model_validator

HTTP_ROUTE_API_VERSION: Final = "gateway.networking.k8s.io/v1"
BACKEND_API_VERSION: Final = "gateway.envoyproxy.io/v1alpha1"
GATEWAY_API_GROUP: Final = "gateway.networking.k8s.io"
ENVOY_GATEWAY_GROUP: Final = "gateway.envoyproxy.io"
MAX_RULES = 64
MAX_MATCHES = 16
MAX_BACKEND_REFS = 16
MAX_HOSTNAMES = 16
MAX_ENDPOINTS = 64

_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
# Labels joined by single dots ("a..b" and "a.-b" are no DNS names), at most 253.
_DNS_SUBDOMAIN = re.compile(rf"^{_LABEL}(\.{_LABEL})*$")
_DNS_LABEL = re.compile(f"^{_LABEL}$")
# Gateway API's Hostname: a DNS name, optionally with one leading "*." label.
_HOSTNAME = re.compile(rf"^(\*\.)?{_LABEL}(\.{_LABEL})*$")
# Path values: absolute, no whitespace, no "?" or "#" (those are not paths).
_PATH = re.compile(r"^/[^\s?#]*$")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


def _dns_subdomain(value: str) -> str:
    if len(value) > 253 or not _DNS_SUBDOMAIN.match(value):
        raise ValueError("must be a DNS-1123 subdomain (lower-case letters, digits, '-', '.')")
    return value


def _dns_label(value: str | None) -> str | None:
    """Names of namespaces, Services and Backends: one DNS-1123 label, at most 63."""
    if value is not None and (len(value) > 63 or not _DNS_LABEL.match(value)):
        raise ValueError("must be a DNS-1123 label (lower-case letters, digits and '-')")
    return value


class Metadata(_Model):
    name: str
    namespace: str

    @field_validator("name", "namespace")
    @classmethod
    def _label(cls, value: str) -> str:
        return str(_dns_label(value))


class ParentRef(_Model):
    """A gateway the route attaches to; gateways name themselves in their bootstrap."""

    group: Literal["gateway.networking.k8s.io"] = GATEWAY_API_GROUP
    kind: Literal["Gateway"] = "Gateway"
    name: str
    namespace: str | None = None

    @field_validator("name")
    @classmethod
    def _dns(cls, value: str) -> str:
        return _dns_subdomain(value)

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, value: str | None) -> str | None:
        return _dns_label(value)


class PathMatch(_Model):
    type: Literal["PathPrefix", "Exact"] = "PathPrefix"
    value: str = "/"

    @field_validator("value")
    @classmethod
    def _path(cls, value: str) -> str:
        if not _PATH.match(value) or len(value) > 1024:
            raise ValueError("must be an absolute path without '?', '#' or spaces (<= 1024)")
        return value


class RouteMatch(_Model):
    path: PathMatch = Field(default_factory=PathMatch)


class BackendRef(_Model):
    """A Kubernetes ``Service`` (needs ``port``) or an Envoy Gateway ``Backend``.

    Both are named by one DNS label (a Service becomes
    ``{name}.{namespace}.svc.cluster.local``, so a dotted name would reach
    some other host; a Backend is stored as ``{namespace}.{name}``).
    """

    group: Literal["", "gateway.envoyproxy.io"] = ""
    kind: Literal["Service", "Backend"] = "Service"
    name: str
    namespace: str | None = None
    port: StrictInt | None = Field(default=None, ge=1, le=65535)
    weight: StrictInt = Field(default=1, ge=0, le=1_000_000)

    @field_validator("name", "namespace")
    @classmethod
    def _dns(cls, value: str | None) -> str | None:
        return _dns_label(value)

    @model_validator(mode="after")
    def _consistent(self) -> BackendRef:
        if self.kind == "Service" and self.group != "":
            raise ValueError("a Service backendRef has group '' (the core API group)")
        if self.kind == "Backend" and self.group != ENVOY_GATEWAY_GROUP:
            raise ValueError(f"a Backend backendRef has group {ENVOY_GATEWAY_GROUP!r}")
        if self.kind == "Service" and self.port is None:
            raise ValueError("a Service backendRef needs a port")
        return self


class RouteRule(_Model):
    matches: tuple[RouteMatch, ...] = Field(default=(RouteMatch(),), max_length=MAX_MATCHES)
    backend_refs: tuple[BackendRef, ...] = Field(
        alias="backendRefs", min_length=1, max_length=MAX_BACKEND_REFS
    )


class HTTPRouteSpec(_Model):
    parent_refs: tuple[ParentRef, ...] = Field(default=(), alias="parentRefs", max_length=16)
    hostnames: tuple[str, ...] = Field(default=(), max_length=MAX_HOSTNAMES)
    rules: tuple[RouteRule, ...] = Field(min_length=1, max_length=MAX_RULES)

    @field_validator("hostnames")
    @classmethod
    def _hostnames(cls, values: tuple[str, ...]) -> tuple[str, ...]:
        for value in values:
            if not _HOSTNAME.match(value) or len(value) > 253:
                raise ValueError(f"{value!r} is not a hostname (a DNS name, '*.' prefix allowed)")
        if len(set(values)) != len(values):
            raise ValueError("hostnames repeat")
        return values


class HTTPRoute(_Model):
    api_version: Literal["gateway.networking.k8s.io/v1"] = Field(
        default=HTTP_ROUTE_API_VERSION, alias="apiVersion"
    )
    kind: Literal["HTTPRoute"] = "HTTPRoute"
    metadata: Metadata
    spec: HTTPRouteSpec


class IPEndpoint(_Model):
    address: str
    port: StrictInt = Field(ge=1, le=65535)

    @field_validator("address")
    @classmethod
    def _ip(cls, value: str) -> str:
        try:
            return str(ipaddress.ip_address(value))
        except ValueError:
            raise ValueError("must be an IPv4 or IPv6 address") from None


class FQDNEndpoint(_Model):
    hostname: str
    port: StrictInt = Field(ge=1, le=65535)

    @field_validator("hostname")
    @classmethod
    def _dns(cls, value: str) -> str:
        return _dns_subdomain(value)


class BackendEndpoint(_Model):
    ip: IPEndpoint | None = None
    fqdn: FQDNEndpoint | None = None

    @model_validator(mode="after")
    def _one(self) -> BackendEndpoint:
        if (self.ip is None) == (self.fqdn is None):
            raise ValueError("an endpoint is exactly one of ip or fqdn")
        return self


class BackendSpec(_Model):
    endpoints: tuple[BackendEndpoint, ...] = Field(min_length=1, max_length=MAX_ENDPOINTS)

    @model_validator(mode="after")
    def _one_kind(self) -> BackendSpec:
        kinds = {"ip" if e.ip is not None else "fqdn" for e in self.endpoints}
        if len(kinds) > 1:
            raise ValueError("endpoints are all ip or all fqdn (Envoy resolves a cluster one way)")
        return self


class Backend(_Model):
    api_version: Literal["gateway.envoyproxy.io/v1alpha1"] = Field(
        default=BACKEND_API_VERSION, alias="apiVersion"
    )
    kind: Literal["Backend"] = "Backend"
    metadata: Metadata
    spec: BackendSpec
