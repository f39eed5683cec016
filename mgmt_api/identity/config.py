"""The ``spec.identityProvider`` section of the management plane's install config.

Shape (the install resource's ``spec.identityProvider``, extended with several
named OIDC configurations, secrets by reference, and an LDAP sync source)::

    spec:
      identityProvider:
        oidc:                       # one mapping, or a list of mappings with `name`
          - name: corp
            clientId: meshplane
            clientSecret: {file: /var/run/secrets/oidc/client-secret}   # or {env: VAR}
            providerConfig: {dynamic: {configurationUri: https://idp/.well-known/openid-configuration}}
            redirectUri: https://mp.example.com:8443/iam/v2/oidc/callback
            scopes: [email, profile, offline_access]
            offlineAccessConfig:
              deviceCodeAuth: {clientId: meshctl}
              tokenExchange: {clientId: ci-robot, audience: api://meshplane}
            users: {sourceTypes: [AZURE], organizations: [acme]}   # who may log in
        sync:
          interval: 1h
          maxDeletePercent: 50
          azure: {clientId: ..., tenantId: ..., clientSecret: {env: AZURE_SECRET}}
          # or
          ldap: {url: ldaps://..., bindDn: ..., bindPassword: {file: ...},
                 userBase: ..., groupBase: ...}

Environment overrides: ``MESHPLANE_IDENTITYPROVIDER__<path>`` where the path
segments are separated by ``__`` and match keys case-insensitively; in the
``oidc`` list a segment selects the entry by ``name``. The value is parsed as
a YAML scalar or flow sequence, e.g.
``MESHPLANE_IDENTITYPROVIDER__OIDC__CORP__SCOPES='[email, profile]'``.
Overrides are applied before validation, so they get the same checks.

Validation is strict: unknown keys are refused (a typo such as ``clientID``
would otherwise silently disable a feature), and every error names the file,
line and field.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from meshplane.config_error import ConfigError
from meshplane.validate import Node, kind_of
from meshplane.yamlconf import load_yaml, loads_yaml
from mgmt_api.domain.durations import duration_seconds
from mgmt_api.fqn import is_name
from mgmt_api.identity.secrets import SecretRef

ENV_PREFIX = "MESHPLANE_IDENTITYPROVIDER__"
DEFAULT_SCOPES = ("email", "profile", "offline_access")
ALLOWED_SCOPES = frozenset({"openid", "email", "profile", "offline_access"})
DEFAULT_SYNC_INTERVAL_S = 3600.0
MIN_SYNC_INTERVAL_S = 10.0
DEFAULT_MAX_DELETE_PERCENT = 50
DIRECTORY_SOURCE_TYPES = frozenset({"LDAP", "AZURE"})


@dataclass(frozen=True, slots=True)
class OidcConfig:
    """One named OIDC provider configuration."""

    name: str
    client_id: str
    client_secret: SecretRef
    configuration_uri: str
    redirect_uri: str
    scopes: tuple[str, ...]
    device_code_client_id: str | None = None
    token_exchange_client_id: str | None = None
    token_exchange_audience: tuple[str, ...] = ()
    """``tokenExchange.audience``; empty means the default, see ``token_exchange_audiences``."""
    user_source_types: tuple[str, ...] = ()
    """Directory source types (``LDAP``, ``AZURE``) whose synced users this provider's
    accounts may log in as (``users.sourceTypes``)."""
    user_organizations: tuple[str, ...] = ()
    """The organizations those synced users must be in (``users.organizations``)."""

    @property
    def request_scopes(self) -> tuple[str, ...]:
        """The scopes to send: ``openid`` always first, then the configured ones."""
        return ("openid", *(s for s in self.scopes if s != "openid"))

    @property
    def token_exchange_audiences(self) -> frozenset[str]:
        """The ``aud`` values a token-exchange subject token may carry.

        Default: ``api://<clientId>`` (the Application ID URI Entra ID proposes
        for the management plane's app) and ``<clientId>`` itself (what Entra
        puts into ``aud`` of a version 2.0 access token for that app).
        """
        if self.token_exchange_audience:
            return frozenset(self.token_exchange_audience)
        return frozenset({f"api://{self.client_id}", self.client_id})

    @property
    def cookie_path(self) -> str:
        """The login cookie's path: the callback's public path (``redirectUri``), so it
        is right behind a proxy that serves the API under a prefix such as ``/iam``."""
        return urlsplit(self.redirect_uri).path or "/"

    @property
    def cookie_secure(self) -> bool:
        """``Secure`` when the public callback is https, even if TLS ends at a proxy."""
        return urlsplit(self.redirect_uri).scheme == "https"


@dataclass(frozen=True, slots=True)
class AzureSyncConfig:
    """Microsoft Graph directory sync (client-credentials app with Directory.Read.All)."""

    client_id: str
    tenant_id: str
    client_secret: SecretRef
    graph_base_url: str = "https://graph.microsoft.com"
    authority_base_url: str = "https://login.microsoftonline.com"


@dataclass(frozen=True, slots=True)
class LdapAttributes:
    """Which LDAP attributes hold each user and group field."""

    user_id: str = "uid"
    login_name: str = "uid"
    email: str = "mail"
    display_name: str = "cn"
    group_id: str = "cn"
    group_display_name: str = "cn"
    group_description: str = "description"
    member: str = "member"


@dataclass(frozen=True, slots=True)
class LdapSyncConfig:
    """LDAP directory sync."""

    url: str
    bind_dn: str
    bind_password: SecretRef
    user_base: str
    group_base: str
    user_filter: str = "(objectClass=inetOrgPerson)"
    group_filter: str = "(objectClass=groupOfNames)"
    attributes: LdapAttributes = field(default_factory=LdapAttributes)
    page_size: int = 500
    timeout_s: float = 10.0
    start_tls: bool = False
    """Upgrade an ``ldap://`` connection with StartTLS (RFC 4511 4.14) before the bind."""
    ca_file: str | None = None
    """CA bundle that verifies the server certificate (default: the system's)."""


@dataclass(frozen=True, slots=True)
class SyncConfig:
    """Directory sync: exactly one source, run every ``interval_s`` seconds."""

    interval_s: float
    azure: AzureSyncConfig | None = None
    ldap: LdapSyncConfig | None = None
    organizations: tuple[str, ...] = ()
    """The organizations the directory is synced into (periodic job and ``:sync``).

    Explicit, so that an organization admin cannot copy the company
    directory into an organization of their own by calling ``:sync``."""
    max_delete_percent: int = DEFAULT_MAX_DELETE_PERCENT
    """A run that would delete more than this share of the synced users (or teams)
    is refused unless forced: an empty or truncated, yet "successful", listing
    must not wipe the organization."""

    @property
    def source_type(self) -> str:
        """``AZURE`` or ``LDAP``, the SourceType recorded on synced users and teams."""
        return "AZURE" if self.azure is not None else "LDAP"


@dataclass(frozen=True, slots=True)
class IdentityProviderConfig:
    """The whole ``spec.identityProvider`` section."""

    oidc: tuple[OidcConfig, ...] = ()
    sync: SyncConfig | None = None

    @property
    def oidc_enabled(self) -> bool:
        return bool(self.oidc)

    def oidc_named(self, name: str | None) -> OidcConfig | None:
        """The configuration for ``name``; without a name, the first one listed."""
        if not self.oidc:
            return None
        if name is None or name == "":
            return self.oidc[0]
        return next((c for c in self.oidc if c.name == name), None)


# --------------------------------------------------------------------------- reading

# The keys of each mapping, declared once: the validator refuses any other, and
# environment overrides (``_KNOWN_KEYS``) may add any of them.
_ROOT_KEYS = ("oidc", "sync")
_OIDC_REQUIRED = ("clientId", "clientSecret", "providerConfig", "redirectUri")
_OIDC_OPTIONAL = ("name", "scopes", "offlineAccessConfig", "users")
_PROVIDER_KEYS = ("dynamic",)
_DYNAMIC_KEYS = ("configurationUri",)
_OFFLINE_KEYS = ("deviceCodeAuth", "tokenExchange")
_DEVICE_KEYS = ("clientId",)
_EXCHANGE_OPTIONAL = ("audience",)
_USERS_KEYS = ("sourceTypes", "organizations")
_SECRET_KEYS = ("file", "env")
_SYNC_REQUIRED = ("organizations",)
_SYNC_OPTIONAL = ("interval", "azure", "ldap", "maxDeletePercent")
_AZURE_REQUIRED = ("clientId", "tenantId", "clientSecret")
_AZURE_OPTIONAL = ("graphBaseUrl", "authorityBaseUrl")
_LDAP_REQUIRED = ("url", "bindDn", "bindPassword", "userBase", "groupBase")
_LDAP_OPTIONAL = (
    "userFilter",
    "groupFilter",
    "attributes",
    "pageSize",
    "timeout",
    "startTls",
    "caFile",
)
_ATTRIBUTE_KEYS = {
    "userId": "user_id",
    "loginName": "login_name",
    "email": "email",
    "displayName": "display_name",
    "groupId": "group_id",
    "groupDisplayName": "group_display_name",
    "groupDescription": "group_description",
    "member": "member",
}
_LOOPBACK = {"localhost", "127.0.0.1", "::1"}
_LOOPBACK_IPS = {"127.0.0.1", "::1"}


def _https_url(node: Node) -> str:
    """An https URL; plain http only to a loopback address (a local test provider)."""
    text = node.url()
    parts = urlsplit(text)
    if parts.scheme != "https" and parts.hostname not in _LOOPBACK:
        raise node.error("must use https (http is allowed only for loopback addresses)")
    return text


def _secret(node: Node) -> SecretRef:
    if isinstance(node.value, str):
        # Deliberately no echo of the value: it is probably the secret itself.
        raise node.error(
            "must reference the secret as {file: PATH} or {env: VARIABLE}, not a literal"
        )
    fields = node.fields(optional=_SECRET_KEYS)
    if len(fields) != 1:
        raise node.error("must have exactly one of 'file' or 'env'")
    ((kind, value_node),) = fields
    location = value_node.string(strip=True)
    if kind == "env":
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", location):
            raise value_node.error(f"{location!r} is not an environment variable name")
        return SecretRef("env", location)
    return SecretRef("file", location)


def _interval(node: Node) -> float:
    """``90`` (seconds) or a duration string (``"90s"``, ``"15m"``, ``"1h30m"``)."""
    value = node.value
    if isinstance(value, bool):
        raise node.error("must be a duration such as 30m or 1h")
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        try:
            seconds = duration_seconds(node.string(strip=True))
        except ValueError as exc:
            raise node.error(str(exc)) from None
    if seconds < MIN_SYNC_INTERVAL_S:
        raise node.error(f"must be at least {MIN_SYNC_INTERVAL_S:g}s")
    return seconds


_CALLBACK_SUFFIX = "/v2/oidc/callback"
# Marks a ``users`` field left out, so that ``parse_identity_provider`` can apply the
# defaults that depend on the sync section (parsed after the OIDC list).
_UNSET: tuple[str, ...] = ("\0unset",)


def _oidc(node: Node, default_name: str | None) -> OidcConfig:
    f = node.fields(_OIDC_REQUIRED, _OIDC_OPTIONAL)
    name_node = f.optional("name")
    if name_node is not None:
        name = name_node.string(strip=True)
    elif default_name is not None:
        name = default_name
    else:
        raise node.error("entries of a list of OIDC configurations need a 'name'")
    if not is_name(name):
        raise (name_node or node).error(f"{name!r} is not a DNS-1123 label")
    provider = f.required("providerConfig").fields(_PROVIDER_KEYS)
    dynamic = provider.required("dynamic").fields(_DYNAMIC_KEYS)
    configuration_uri = _https_url(dynamic.required("configurationUri"))
    device_id, exchange_id, audience = _offline_access(f.optional("offlineAccessConfig"))
    source_types, organizations = _users(f.optional("users"))
    return OidcConfig(
        name=name,
        client_id=f.required("clientId").string(strip=True),
        client_secret=_secret(f.required("clientSecret")),
        configuration_uri=configuration_uri,
        redirect_uri=_https_url(f.required("redirectUri")),
        scopes=_scopes(f.optional("scopes")),
        device_code_client_id=device_id,
        token_exchange_client_id=exchange_id,
        token_exchange_audience=audience,
        user_source_types=source_types,
        user_organizations=organizations,
    )


def _scopes(node: Node | None) -> tuple[str, ...]:
    if node is None:
        return DEFAULT_SCOPES
    items = node.items()
    scopes = tuple(item.string(strip=True) for item in items)
    for item, scope in zip(items, scopes, strict=True):
        if scope not in ALLOWED_SCOPES:
            raise item.error(
                f"unknown scope {scope!r}; allowed: {', '.join(sorted(ALLOWED_SCOPES))}"
            )
    if len(set(scopes)) != len(scopes):
        raise node.error("lists a scope twice")
    return scopes


def _offline_access(node: Node | None) -> tuple[str | None, str | None, tuple[str, ...]]:
    """``offlineAccessConfig``: (device-code client, token-exchange client, audiences)."""
    if node is None:
        return None, None, ()
    offline = node.fields(optional=_OFFLINE_KEYS)
    device_id = exchange_id = None
    audience: tuple[str, ...] = ()
    dca = offline.optional("deviceCodeAuth")
    if dca is not None:
        device_id = dca.fields(_DEVICE_KEYS).required("clientId").string(strip=True)
    tex = offline.optional("tokenExchange")
    if tex is not None:
        tex_fields = tex.fields(_DEVICE_KEYS, _EXCHANGE_OPTIONAL)
        exchange_id = tex_fields.required("clientId").string(strip=True)
        aud = tex_fields.optional("audience")
        if aud is not None:
            audience = _strings(aud)
    return device_id, exchange_id, audience


def _users(node: Node | None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``users``: (source types, organizations), each ``_UNSET`` when left out."""
    if node is None:
        return _UNSET, _UNSET
    users = node.fields(optional=_USERS_KEYS)
    source_types = organizations = _UNSET
    types_node = users.optional("sourceTypes")
    if types_node is not None:
        source_types = _strings(types_node, allow_empty=True)
        for value in source_types:
            if value not in DIRECTORY_SOURCE_TYPES:
                raise types_node.error(f"{value!r} is not a directory source type (LDAP or AZURE)")
    orgs_node = users.optional("organizations")
    if orgs_node is not None:
        organizations = _organizations(orgs_node, allow_empty=True)
    return source_types, organizations


def _check_callback(node: Node, config: OidcConfig, *, default: bool) -> None:
    """``redirectUri`` must be this configuration's callback route, so the provider sends
    the browser to the handler that owns its ``state`` and the login cookie's path
    (derived from it) covers that request."""
    parts = urlsplit(config.redirect_uri)
    path = parts.path.rstrip("/")
    named = f"/v2/oidc/{config.name}/callback"
    query_name = dict(parse_qsl(parts.query)).get("name")
    if path.endswith(named):
        return
    if path.endswith(_CALLBACK_SUFFIX) and (query_name == config.name or default):
        return
    hint = f"/v2/oidc/callback or {named}" if default else named
    raise node.error(
        f"must be the public URL of this configuration's callback, ending in {hint} "
        "(a reverse-proxy prefix before /v2 is fine)"
    )


def _azure(node: Node) -> AzureSyncConfig:
    f = node.fields(_AZURE_REQUIRED, _AZURE_OPTIONAL)
    extra: dict[str, str] = {}
    for key, attr in (
        ("graphBaseUrl", "graph_base_url"),
        ("authorityBaseUrl", "authority_base_url"),
    ):
        url = f.optional(key)
        if url is not None:
            extra[attr] = _https_url(url).rstrip("/")
    tenant_node = f.required("tenantId")
    tenant = tenant_node.string(strip=True)
    if not re.fullmatch(r"[A-Za-z0-9.-]+", tenant):
        raise tenant_node.error("must be a tenant GUID or domain name")
    return AzureSyncConfig(
        client_id=f.required("clientId").string(strip=True),
        tenant_id=tenant,
        client_secret=_secret(f.required("clientSecret")),
        **extra,
    )


def _ldap(node: Node) -> LdapSyncConfig:
    f = node.fields(_LDAP_REQUIRED, _LDAP_OPTIONAL)
    kwargs: dict[str, Any] = {}
    for key, attr in (("userFilter", "user_filter"), ("groupFilter", "group_filter")):
        filter_node = f.optional(key)
        if filter_node is not None:
            text = filter_node.string(strip=True)
            if not (text.startswith("(") and text.endswith(")")):
                raise filter_node.error("must be an LDAP filter in parentheses")
            kwargs[attr] = text
    attributes = f.optional("attributes")
    if attributes is not None:
        attrs = attributes.fields(optional=_ATTRIBUTE_KEYS)
        kwargs["attributes"] = LdapAttributes(
            **{_ATTRIBUTE_KEYS[k]: v.string(strip=True) for k, v in attrs}
        )
    page_size = f.optional("pageSize")
    if page_size is not None:
        kwargs["page_size"] = page_size.integer(1, 10000)
    timeout = f.optional("timeout")
    if timeout is not None:
        kwargs["timeout_s"] = timeout.number(0, above=True)
    url_node = f.required("url")
    url = url_node.url(schemes=("ldap", "ldaps"))
    tls_node = f.optional("startTls")
    start_tls = tls_node.boolean() if tls_node is not None else False
    parts = urlsplit(url)
    if tls_node is not None and start_tls and parts.scheme == "ldaps":
        raise tls_node.error("ldaps:// is TLS already; StartTLS is for ldap:// URLs")
    if parts.scheme == "ldap" and not start_tls and parts.hostname not in _LOOPBACK_IPS:
        # The bind password and the whole directory would cross the network in clear.
        raise url_node.error(
            "ldap:// to a non-loopback host sends the bind password in clear: use ldaps:// "
            "or set startTls: true"
        )
    kwargs["start_tls"] = start_tls
    ca_file = f.optional("caFile")
    if ca_file is not None:
        kwargs["ca_file"] = ca_file.string(strip=True)
    return LdapSyncConfig(
        url=url,
        bind_dn=f.required("bindDn").string(strip=True),
        bind_password=_secret(f.required("bindPassword")),
        user_base=f.required("userBase").string(strip=True),
        group_base=f.required("groupBase").string(strip=True),
        **kwargs,
    )


def _sync(node: Node) -> SyncConfig:
    f = node.fields(_SYNC_REQUIRED, _SYNC_OPTIONAL)
    azure, ldap = f.present("azure"), f.present("ldap")
    if (azure is None) == (ldap is None):
        raise node.error("must configure exactly one source: 'azure' or 'ldap'")
    interval = f.optional("interval")
    percent = f.optional("maxDeletePercent")
    return SyncConfig(
        interval_s=_interval(interval) if interval is not None else DEFAULT_SYNC_INTERVAL_S,
        azure=_azure(azure) if azure is not None else None,
        ldap=_ldap(ldap) if ldap is not None else None,
        organizations=_organizations(f.required("organizations")),
        max_delete_percent=(
            percent.integer(0, 100) if percent is not None else DEFAULT_MAX_DELETE_PERCENT
        ),
    )


def _strings(node: Node, *, allow_empty: bool = False) -> tuple[str, ...]:
    """A string or a list of unique strings."""
    if isinstance(node.value, str):
        return (node.string(strip=True),)
    values = tuple(item.string(strip=True) for item in node.items())
    if not values and not allow_empty:
        raise node.error("must not be empty")
    if len(set(values)) != len(values):
        raise node.error("lists a value twice")
    return values


def _organizations(node: Node, *, allow_empty: bool = False) -> tuple[str, ...]:
    items = node.items()
    names = tuple(item.string(strip=True) for item in items)
    if not names and not allow_empty:
        raise node.error("must list at least one organization")
    for item, name in zip(items, names, strict=True):
        if not is_name(name):
            raise item.error(f"{name!r} is not an organization name (a DNS-1123 label)")
    if len(set(names)) != len(names):
        raise node.error("organizations must be unique")
    return names


def parse_identity_provider(
    value: Any, *, source: str | None = None, line: int | None = None
) -> IdentityProviderConfig:
    """Validate the ``identityProvider`` mapping (already overridden from the environment)."""
    if value is None:
        return IdentityProviderConfig()
    root = Node(value, source=source, path="spec.identityProvider", line=line)
    f = root.fields(optional=_ROOT_KEYS)
    oidc: tuple[OidcConfig, ...] = ()
    node = f.present("oidc")
    if node is not None:
        entries = node.items() if isinstance(node.value, list) else [node]
        if isinstance(node.value, list):
            oidc = tuple(_oidc(item, None) for item in entries)
            if not oidc:
                raise node.error("must list at least one OIDC configuration")
        else:
            oidc = (_oidc(node, "default"),)
        names = [c.name for c in oidc]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise node.error(f"OIDC configuration names must be unique: {', '.join(dupes)}")
        for i, (entry, config) in enumerate(zip(entries, oidc, strict=True)):
            _check_callback(entry.child("redirectUri"), config, default=i == 0)
    sync_node = f.present("sync")
    sync = _sync(sync_node) if sync_node is not None else None
    return IdentityProviderConfig(
        oidc=tuple(_user_defaults(c, sync, default=i == 0) for i, c in enumerate(oidc)),
        sync=sync,
    )


def _user_defaults(config: OidcConfig, sync: SyncConfig | None, *, default: bool) -> OidcConfig:
    """Fill ``users`` left out: the default (first) configuration logs in the users the
    pull sync creates; any other configuration only the users bound to it explicitly."""
    inherit = default and sync is not None
    source_types = config.user_source_types
    if source_types == _UNSET:
        source_types = (sync.source_type,) if inherit and sync is not None else ()
    organizations = config.user_organizations
    if organizations == _UNSET:
        organizations = sync.organizations if inherit and sync is not None else ()
    return dataclasses.replace(
        config, user_source_types=source_types, user_organizations=organizations
    )


# --------------------------------------------------------------------------- env overrides


def apply_env_overrides(document: Any, environ: Mapping[str, str]) -> Any:
    """Apply ``MESHPLANE_IDENTITYPROVIDER__...`` variables to the identityProvider mapping.

    Returns a new structure; the input is not modified. Keys are matched
    case-insensitively against existing keys and the known field names, so
    a variable can also add a field the file leaves out.
    """
    overrides = sorted((k, v) for k, v in environ.items() if k.startswith(ENV_PREFIX))
    if not overrides:
        return document
    doc = _deep_copy(document) if document is not None else {}
    for variable, raw in overrides:
        segments = [s for s in variable[len(ENV_PREFIX) :].split("__")]
        if not segments or any(not s for s in segments):
            raise ConfigError(f"malformed override variable {variable}")
        value = loads_yaml(raw, source=variable) if raw.strip() else ""
        _set_path(doc, segments, value, variable)
    return doc


def _deep_copy(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _deep_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_deep_copy(v) for v in value]
    return value


_KNOWN_KEYS = frozenset(
    (
        *(*_ROOT_KEYS, *_OIDC_REQUIRED, *_OIDC_OPTIONAL, *_PROVIDER_KEYS, *_DYNAMIC_KEYS),
        *(*_OFFLINE_KEYS, *_DEVICE_KEYS, *_EXCHANGE_OPTIONAL, *_USERS_KEYS, *_SECRET_KEYS),
        *(*_SYNC_REQUIRED, *_SYNC_OPTIONAL, *_AZURE_REQUIRED, *_AZURE_OPTIONAL),
        *(*_LDAP_REQUIRED, *_LDAP_OPTIONAL, *_ATTRIBUTE_KEYS),
    )
)
"""Every key of the section: what an environment override may name."""


def _canonical(segment: str, existing: Any) -> str:
    candidates = list(existing) if isinstance(existing, Mapping) else []
    for key in [*candidates, *sorted(_KNOWN_KEYS)]:
        if isinstance(key, str) and key.lower() == segment.lower():
            return key
    return segment


def _set_path(doc: Any, segments: list[str], value: Any, variable: str) -> None:
    node = doc
    for i, segment in enumerate(segments):
        last = i == len(segments) - 1
        if isinstance(node, list):
            # A list of named entries (oidc): select by name.
            match = next(
                (
                    e
                    for e in node
                    if isinstance(e, Mapping) and str(e.get("name", "")).lower() == segment.lower()
                ),
                None,
            )
            if match is None:
                raise ConfigError(f"no entry named {segment.lower()!r}", source=variable)
            if last:
                raise ConfigError(
                    "cannot replace a whole list entry from the environment", source=variable
                )
            node = match
            continue
        if not isinstance(node, dict):
            raise ConfigError(f"{segment} is not inside a mapping", source=variable)
        key = _canonical(segment, node)
        if key not in _KNOWN_KEYS and key not in node:
            raise ConfigError(f"unknown field {segment}", source=variable)
        if last:
            node[key] = value
        else:
            if node.get(key) is None:
                node[key] = {}
            node = node[key]


def load_identity_provider(
    path: Path, environ: Mapping[str, str] | None = None
) -> IdentityProviderConfig:
    """Read ``spec.identityProvider`` from an install-config YAML file plus overrides.

    A missing section means identity features are off (``oidc_enabled`` is
    false), which is what ``/v2/oidc/configuration`` reports.
    """
    root = Node(load_yaml(path), source=str(path))
    section = Node(None, line=root.line)
    if root.value is not None:
        if not isinstance(root.value, dict):
            raise root.error(f"the install config must be a mapping, got {kind_of(root.value)}")
        spec = root.child("spec")
        if spec.value is not None:
            if not isinstance(spec.value, dict):
                raise spec.error(f"must be a mapping, got {kind_of(spec.value)}")
            section = spec.child("identityProvider")
    env = os.environ if environ is None else environ
    value = apply_env_overrides(section.value, env)
    return parse_identity_provider(value, source=str(path), line=section.line)
