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
from meshplane.yamlconf import LocatedDict, LocatedList, load_yaml, loads_yaml
from mgmt_api.fqn import is_name
from mgmt_api.identity.secrets import SecretRef

ENV_PREFIX = "MESHPLANE_IDENTITYPROVIDER__"
DEFAULT_SCOPES = ("email", "profile", "offline_access")
ALLOWED_SCOPES = frozenset({"openid", "email", "profile", "offline_access"})
DEFAULT_SYNC_INTERVAL_S = 3600.0
MIN_SYNC_INTERVAL_S = 10.0
DEFAULT_MAX_DELETE_PERCENT = 50
DIRECTORY_SOURCE_TYPES = frozenset({"LDAP", "AZURE"})
_DURATION_RE = re.compile(r"^(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")


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


class _Node:
    """A position in the document, for error messages that name file, line and field."""

    def __init__(self, value: Any, path: str, source: str | None, line: int | None) -> None:
        self.value = value
        self.path = path
        self.source = source
        self.line = line

    def error(self, message: str) -> ConfigError:
        return ConfigError(message, source=self.source, line=self.line, field=self.path)

    def mapping(self, allowed: frozenset[str]) -> dict[str, _Node]:
        if not isinstance(self.value, Mapping):
            raise self.error(f"must be a mapping, got {_kind(self.value)}")
        out: dict[str, _Node] = {}
        for key, value in self.value.items():
            line = self.value.line_of(key) if isinstance(self.value, LocatedDict) else self.line
            child_path = f"{self.path}.{key}" if self.path else str(key)
            if key not in allowed:
                hint = _closest(str(key), allowed)
                raise ConfigError(
                    f"unknown field{hint}; allowed: {', '.join(sorted(allowed))}",
                    source=self.source,
                    line=line,
                    field=child_path,
                )
            out[str(key)] = _Node(value, child_path, self.source, line)
        return out

    def items(self) -> list[_Node]:
        if not isinstance(self.value, list):
            raise self.error(f"must be a list, got {_kind(self.value)}")
        nodes = []
        for i, item in enumerate(self.value):
            line = self.value.line_of(i) if isinstance(self.value, LocatedList) else self.line
            nodes.append(_Node(item, f"{self.path}[{i}]", self.source, line))
        return nodes

    def string(self) -> str:
        if not isinstance(self.value, str) or not self.value.strip():
            raise self.error(f"must be a non-empty string, got {_kind(self.value)}")
        return self.value.strip()

    def url(self, *, https_only: bool = False, schemes: tuple[str, ...] = ("http", "https")) -> str:
        text = self.string()
        parts = urlsplit(text)
        if parts.scheme not in schemes or not parts.netloc:
            raise self.error(f"must be an absolute {'/'.join(schemes)} URL, got {text!r}")
        if https_only and parts.scheme != "https" and parts.hostname not in _LOOPBACK:
            raise self.error("must use https (http is allowed only for loopback addresses)")
        return text


_LOOPBACK = {"localhost", "127.0.0.1", "::1"}
_LOOPBACK_IPS = {"127.0.0.1", "::1"}


def _kind(value: Any) -> str:
    if value is None:
        return "nothing"
    return type(value).__name__.replace("Located", "").lower()


def _closest(key: str, allowed: frozenset[str]) -> str:
    lowered = {a.lower(): a for a in allowed}
    match = lowered.get(key.lower())
    return f" (did you mean {match!r}?)" if match else ""


def _required(fields: dict[str, _Node], name: str, parent: _Node) -> _Node:
    node = fields.get(name)
    if node is None or node.value is None:
        raise ConfigError(
            "is required",
            source=parent.source,
            line=parent.line,
            field=f"{parent.path}.{name}" if parent.path else name,
        )
    return node


def _secret(node: _Node) -> SecretRef:
    if isinstance(node.value, str):
        # Deliberately no echo of the value: it is probably the secret itself.
        raise node.error(
            "must reference the secret as {file: PATH} or {env: VARIABLE}, not a literal"
        )
    fields = node.mapping(frozenset({"file", "env"}))
    if len(fields) != 1:
        raise node.error("must have exactly one of 'file' or 'env'")
    ((kind, value_node),) = fields.items()
    location = value_node.string()
    if kind == "env":
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", location):
            raise value_node.error(f"{location!r} is not an environment variable name")
        return SecretRef("env", location)
    return SecretRef("file", location)


def parse_duration(node: _Node) -> float:
    """``90``, ``"90s"``, ``"15m"``, ``"1h30m"`` → seconds."""
    value = node.value
    if isinstance(value, bool):
        raise node.error("must be a duration such as 30m or 1h")
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        text = node.string()
        match = _DURATION_RE.fullmatch(text)
        if not match or not any(match.groups()):
            raise node.error(f"{text!r} is not a duration such as 90s, 30m or 1h")
        h, m, s = (int(g) if g else 0 for g in match.groups())
        seconds = float(h * 3600 + m * 60 + s)
    if seconds < MIN_SYNC_INTERVAL_S:
        raise node.error(f"must be at least {MIN_SYNC_INTERVAL_S:g}s")
    return seconds


_OIDC_KEYS = frozenset(
    {
        "name",
        "clientId",
        "clientSecret",
        "providerConfig",
        "redirectUri",
        "scopes",
        "offlineAccessConfig",
        "users",
    }
)
_CALLBACK_SUFFIX = "/v2/oidc/callback"
# Marks a ``users`` field left out, so that ``parse_identity_provider`` can apply the
# defaults that depend on the sync section (parsed after the OIDC list).
_UNSET: tuple[str, ...] = ("\0unset",)


def _oidc(node: _Node, default_name: str | None) -> OidcConfig:
    f = node.mapping(_OIDC_KEYS)
    if "name" in f:
        name = f["name"].string()
    elif default_name is not None:
        name = default_name
    else:
        raise node.error("entries of a list of OIDC configurations need a 'name'")
    if not is_name(name):
        raise (f.get("name") or node).error(f"{name!r} is not a DNS-1123 label")
    provider = _required(f, "providerConfig", node).mapping(frozenset({"dynamic"}))
    dynamic = _required(provider, "dynamic", _required(f, "providerConfig", node))
    dyn = dynamic.mapping(frozenset({"configurationUri"}))
    configuration_uri = _required(dyn, "configurationUri", dynamic).url(https_only=True)
    scopes: tuple[str, ...] = DEFAULT_SCOPES
    if "scopes" in f:
        items = f["scopes"].items()
        scopes = tuple(item.string() for item in items)
        for item, scope in zip(items, scopes, strict=True):
            if scope not in ALLOWED_SCOPES:
                raise item.error(
                    f"unknown scope {scope!r}; allowed: {', '.join(sorted(ALLOWED_SCOPES))}"
                )
        if len(set(scopes)) != len(scopes):
            raise f["scopes"].error("lists a scope twice")
    device_id = exchange_id = None
    audience: tuple[str, ...] = ()
    if "offlineAccessConfig" in f:
        offline = f["offlineAccessConfig"].mapping(frozenset({"deviceCodeAuth", "tokenExchange"}))
        if "deviceCodeAuth" in offline:
            dca = offline["deviceCodeAuth"]
            device_id = _required(dca.mapping(frozenset({"clientId"})), "clientId", dca).string()
        if "tokenExchange" in offline:
            tex = offline["tokenExchange"]
            tex_fields = tex.mapping(frozenset({"clientId", "audience"}))
            exchange_id = _required(tex_fields, "clientId", tex).string()
            if "audience" in tex_fields:
                audience = _strings(tex_fields["audience"])
    source_types: tuple[str, ...] | None = None
    organizations: tuple[str, ...] | None = None
    if "users" in f:
        users = f["users"].mapping(frozenset({"sourceTypes", "organizations"}))
        if "sourceTypes" in users:
            source_types = _strings(users["sourceTypes"], allow_empty=True)
            for value in source_types:
                if value not in DIRECTORY_SOURCE_TYPES:
                    raise users["sourceTypes"].error(
                        f"{value!r} is not a directory source type (LDAP or AZURE)"
                    )
        if "organizations" in users:
            organizations = _organizations(users["organizations"], allow_empty=True)
    redirect_node = _required(f, "redirectUri", node)
    redirect_uri = redirect_node.url(https_only=True)
    return OidcConfig(
        name=name,
        client_id=_required(f, "clientId", node).string(),
        client_secret=_secret(_required(f, "clientSecret", node)),
        configuration_uri=configuration_uri,
        redirect_uri=redirect_uri,
        scopes=scopes,
        device_code_client_id=device_id,
        token_exchange_client_id=exchange_id,
        token_exchange_audience=audience,
        user_source_types=source_types if source_types is not None else _UNSET,
        user_organizations=organizations if organizations is not None else _UNSET,
    )


def _check_callback(node: _Node, config: OidcConfig, *, default: bool) -> None:
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


def _azure(node: _Node) -> AzureSyncConfig:
    f = node.mapping(
        frozenset({"clientId", "tenantId", "clientSecret", "graphBaseUrl", "authorityBaseUrl"})
    )
    extra: dict[str, str] = {}
    if "graphBaseUrl" in f:
        extra["graph_base_url"] = f["graphBaseUrl"].url(https_only=True).rstrip("/")
    if "authorityBaseUrl" in f:
        extra["authority_base_url"] = f["authorityBaseUrl"].url(https_only=True).rstrip("/")
    tenant = _required(f, "tenantId", node).string()
    if not re.fullmatch(r"[A-Za-z0-9.-]+", tenant):
        raise f["tenantId"].error("must be a tenant GUID or domain name")
    return AzureSyncConfig(
        client_id=_required(f, "clientId", node).string(),
        tenant_id=tenant,
        client_secret=_secret(_required(f, "clientSecret", node)),
        **extra,
    )


def _ldap(node: _Node) -> LdapSyncConfig:
    f = node.mapping(
        frozenset(
            {
                "url",
                "bindDn",
                "bindPassword",
                "userBase",
                "groupBase",
                "userFilter",
                "groupFilter",
                "attributes",
                "pageSize",
                "timeout",
                "startTls",
                "caFile",
            }
        )
    )
    kwargs: dict[str, Any] = {}
    for key, attr in (("userFilter", "user_filter"), ("groupFilter", "group_filter")):
        if key in f:
            text = f[key].string()
            if not (text.startswith("(") and text.endswith(")")):
                raise f[key].error("must be an LDAP filter in parentheses")
            kwargs[attr] = text
    if "attributes" in f:
        attrs = f["attributes"].mapping(frozenset(_ATTRIBUTE_KEYS))
        kwargs["attributes"] = LdapAttributes(
            **{_ATTRIBUTE_KEYS[k]: v.string() for k, v in attrs.items()}
        )
    if "pageSize" in f:
        size = f["pageSize"].value
        if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= 10000:
            raise f["pageSize"].error("must be an integer from 1 to 10000")
        kwargs["page_size"] = size
    if "timeout" in f:
        timeout = f["timeout"].value
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
            raise f["timeout"].error("must be a positive number of seconds")
        kwargs["timeout_s"] = float(timeout)
    url_node = _required(f, "url", node)
    url = url_node.url(schemes=("ldap", "ldaps"))
    start_tls = False
    if "startTls" in f:
        if not isinstance(f["startTls"].value, bool):
            raise f["startTls"].error("must be true or false")
        start_tls = f["startTls"].value
    parts = urlsplit(url)
    if start_tls and parts.scheme == "ldaps":
        raise f["startTls"].error("ldaps:// is TLS already; StartTLS is for ldap:// URLs")
    if parts.scheme == "ldap" and not start_tls and parts.hostname not in _LOOPBACK_IPS:
        # The bind password and the whole directory would cross the network in clear.
        raise url_node.error(
            "ldap:// to a non-loopback host sends the bind password in clear: use ldaps:// "
            "or set startTls: true"
        )
    kwargs["start_tls"] = start_tls
    if "caFile" in f:
        kwargs["ca_file"] = f["caFile"].string()
    return LdapSyncConfig(
        url=url,
        bind_dn=_required(f, "bindDn", node).string(),
        bind_password=_secret(_required(f, "bindPassword", node)),
        user_base=_required(f, "userBase", node).string(),
        group_base=_required(f, "groupBase", node).string(),
        **kwargs,
    )


def _sync(node: _Node) -> SyncConfig:
    f = node.mapping(frozenset({"interval", "azure", "ldap", "organizations", "maxDeletePercent"}))
    sources = [k for k in ("azure", "ldap") if k in f and f[k].value is not None]
    if len(sources) != 1:
        raise node.error("must configure exactly one source: 'azure' or 'ldap'")
    interval = parse_duration(f["interval"]) if "interval" in f else DEFAULT_SYNC_INTERVAL_S
    organizations = _organizations(_required(f, "organizations", node))
    percent = DEFAULT_MAX_DELETE_PERCENT
    if "maxDeletePercent" in f:
        value = f["maxDeletePercent"].value
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 100:
            raise f["maxDeletePercent"].error("must be an integer from 0 to 100")
        percent = value
    if sources[0] == "azure":
        return SyncConfig(
            interval_s=interval,
            azure=_azure(f["azure"]),
            organizations=organizations,
            max_delete_percent=percent,
        )
    return SyncConfig(
        interval_s=interval,
        ldap=_ldap(f["ldap"]),
        organizations=organizations,
        max_delete_percent=percent,
    )


def _strings(node: _Node, *, allow_empty: bool = False) -> tuple[str, ...]:
    """A string or a list of unique strings."""
    if isinstance(node.value, str):
        return (node.string(),)
    values = tuple(item.string() for item in node.items())
    if not values and not allow_empty:
        raise node.error("must not be empty")
    if len(set(values)) != len(values):
        raise node.error("lists a value twice")
    return values


def _organizations(node: _Node, *, allow_empty: bool = False) -> tuple[str, ...]:
    names = tuple(item.string() for item in node.items())
    if not names and not allow_empty:
        raise node.error("must list at least one organization")
    for item, name in zip(node.items(), names, strict=True):
        if not is_name(name):
            raise item.error(f"{name!r} is not an organization name (a DNS-1123 label)")
    if len(set(names)) != len(names):
        raise node.error("organizations must be unique")
    return names


def parse_identity_provider(
    value: Any, *, source: str | None = None, line: int | None = None
) -> IdentityProviderConfig:
    """Validate the ``identityProvider`` mapping (already overridden from the environment)."""
    root = _Node(value, "spec.identityProvider", source, line)
    if value is None:
        return IdentityProviderConfig()
    f = root.mapping(frozenset({"oidc", "sync"}))
    oidc: tuple[OidcConfig, ...] = ()
    if "oidc" in f and f["oidc"].value is not None:
        node = f["oidc"]
        if isinstance(node.value, list):
            oidc = tuple(_oidc(item, None) for item in node.items())
            if not oidc:
                raise node.error("must list at least one OIDC configuration")
        else:
            oidc = (_oidc(node, "default"),)
        names = [c.name for c in oidc]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise node.error(f"OIDC configuration names must be unique: {', '.join(dupes)}")
        entries = node.items() if isinstance(node.value, list) else [node]
        for i, (entry, config) in enumerate(zip(entries, oidc, strict=True)):
            fields = entry.mapping(_OIDC_KEYS)
            _check_callback(fields["redirectUri"], config, default=i == 0)
    sync = _sync(f["sync"]) if "sync" in f and f["sync"].value is not None else None
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
    _OIDC_KEYS
    | {"oidc", "sync", "dynamic", "configurationUri", "deviceCodeAuth", "tokenExchange"}
    | {"interval", "azure", "ldap", "organizations", "tenantId", "graphBaseUrl"}
    | {"authorityBaseUrl"}
    | {"url", "bindDn", "bindPassword", "userBase", "groupBase", "userFilter", "groupFilter"}
    | {"attributes", "pageSize", "timeout", "file", "env", "startTls", "caFile"}
    | {"audience", "users", "sourceTypes", "maxDeletePercent"}
    | set(_ATTRIBUTE_KEYS)
)


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
    document = load_yaml(path)
    source = str(path)
    section: Any = None
    line: int | None = None
    if document is not None:
        if not isinstance(document, Mapping):
            raise ConfigError("the install config must be a mapping", source=source)
        spec = document.get("spec")
        if spec is not None and not isinstance(spec, Mapping):
            raise ConfigError("must be a mapping", source=source, field="spec")
        if spec is not None:
            section = spec.get("identityProvider")
            line = spec.line_of("identityProvider") if isinstance(spec, LocatedDict) else None
    env = os.environ if environ is None else environ
    section = apply_env_overrides(section, env)
    return parse_identity_provider(section, source=source, line=line)
