"""A workload's SecuritySetting -> the HTTP filters of its sidecar's inbound listener.

Pure: the cluster's settings (as the read model found them) and the sidecar's
node in, protojson out. Three things compile here, in this order in front of
the router, so a caller the mode refuses never costs an ext_authz call:

1. the **authorization mode**, as Envoy's RBAC filter on the peer's
   authenticated principal, the URI SAN ``spiffe://<trustDomain>/ns/<ns>/sa/<sa>``
   of its mesh certificate (docs/mesh.md has the table of what each mode
   admits). The rules are the inbound route's (RDS), so a change of mode or of
   a group's namespaces reaches open connections too. A refused call is 403
   with :data:`DENIED_HEADER` ``mode <MODE>``: the denying policy is named
   after the mode, Envoy puts that name in the reply's code details, and the
   listener's local-reply mapper (:mod:`mgmt_api.compiler.denials`, which
   also writes the decision line) tells it from every other refusal;
2. the setting's **local JWT rules** and 3. its **ext_authz** server, both
   rendered by :func:`mgmt_api.compiler.envoy_config.render` from the same
   :class:`~mgmt_api.compiler.envoy_config.ExtAuthzRoute` the gateways get,
   so the two kinds of proxies cannot disagree on what a setting means.

Which setting applies to a namespace is the gateways' rule: the first, by
setting FQN, whose group selects it (:func:`setting_for`). A namespace no
setting selects gets no filter at all (spec 4.11.5: not checked).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from meshplane import decision_log
from mgmt_api.compiler import denials, envoy_config
from mgmt_api.compiler.protojson import JsonDict

#: The response header that says why a call was refused (``mode <MODE>`` by the mode).
DENIED_HEADER = decision_log.DENIED_HEADER
#: The inbound listener's RBAC filter for the mode (named apart from the
#: local JWT rules' ``envoy.filters.http.rbac``: both can be in one chain).
MODE_FILTER = "envoy.filters.http.rbac/mode"
#: RBAC prefixes its stats (``http.inbound.rbac.meshplane_mode_denied``) with
#: this, apart from the local JWT rules' RBAC.
MODE_STAT_PREFIX = "meshplane_mode_"
#: The inbound route's metadata namespace: ``mode`` and ``setting``, for the
#: reason header and the decision line.
ROUTE_METADATA_KEY = denials.ROUTE_METADATA_KEY
_RBAC = "type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC"
_RBAC_PER_ROUTE = "type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBACPerRoute"
#: The mode's RBAC policy is named ``mode-<MODE>``; the local JWT rules' are ``rule-<n>``.
POLICY_PREFIX = denials.MODE_POLICY_PREFIX
#: Modes that compile to no identity check (DISABLED also turns off the rest).
UNCHECKED_MODES = frozenset({"UNSET", "DISABLED"})


@dataclass(frozen=True)
class MeshSetting:
    """One SecuritySetting of a group that reaches the cluster, as sidecars need it.

    ``namespaces`` are the cluster's namespaces its group selects and
    ``workspace_namespaces`` its workspace's, each a name, a prefix ``ab*`` or
    ``*`` (every namespace), as ``service.enforcement.selected_namespaces``
    gives them. ``ext_authz`` is the gateways' entry for the same
    setting (None when it has no ``http.external``, no local rules and is not
    DISABLED).
    """

    setting: str
    mode: str
    namespaces: tuple[str, ...]
    workspace_namespaces: tuple[str, ...] = ()
    service_accounts: tuple[str, ...] = ()
    ext_authz: envoy_config.ExtAuthzRoute | None = None

    def to_json(self) -> JsonDict:
        """Everything the sidecars' resources depend on (the version's input)."""
        return dataclasses.asdict(self)


def setting_for(settings: Sequence[MeshSetting], namespace: str) -> MeshSetting | None:
    """The setting that applies to ``namespace``: the first by FQN that selects it."""
    for setting in sorted(settings, key=lambda s: s.setting):
        if envoy_config.namespace_selected(setting.namespaces, namespace):
            return setting
    return None


def spiffe_id(trust_domain: str, namespace: str, service_account: str) -> str:
    return f"spiffe://{trust_domain}/ns/{namespace}/sa/{service_account}"


def _namespace_prefix(trust_domain: str, pattern: str) -> JsonDict:
    """The principal matcher of every service account of the namespaces ``pattern`` names."""
    if pattern == "*":
        return {"prefix": f"spiffe://{trust_domain}/ns/"}
    if pattern.endswith("*"):  # a namespace name never holds "/": the prefix stays in it
        return {"prefix": f"spiffe://{trust_domain}/ns/{pattern[:-1]}"}
    return {"prefix": f"spiffe://{trust_domain}/ns/{pattern}/sa/"}


def _account(trust_domain: str, account: str, own_namespace: str) -> JsonDict:
    """``ns/sa``, ``ns/*``, ``./sa`` or ``./*`` (``.``: the callee's namespace)."""
    namespace, _, name = account.partition("/")
    namespace = own_namespace if namespace == "." else namespace
    if name == "*":
        return _namespace_prefix(trust_domain, namespace)
    return {"exact": spiffe_id(trust_domain, namespace, name)}


def admitted(setting: MeshSetting, trust_domain: str, namespace: str) -> list[JsonDict] | None:
    """The ``principalName`` matchers the mode admits for a callee in ``namespace``;
    None when the mode checks no identity. An empty list admits nobody (RULES,
    which is not modelled: refusing is the safe reading)."""
    mode = setting.mode
    if mode in UNCHECKED_MODES:
        return None
    if mode == "NAMESPACE":
        return [_namespace_prefix(trust_domain, namespace)]
    if mode == "GROUP":
        return [_namespace_prefix(trust_domain, p) for p in setting.namespaces]
    if mode == "WORKSPACE":
        return [_namespace_prefix(trust_domain, p) for p in setting.workspace_namespaces]
    if mode == "CLUSTER":
        return [{"prefix": f"spiffe://{trust_domain}/"}]
    if mode == "CUSTOM":
        return [_account(trust_domain, a, namespace) for a in setting.service_accounts]
    return []


def mode_route_config(setting: MeshSetting, trust_domain: str, namespace: str) -> JsonDict | None:
    """The inbound route's ``RBACPerRoute`` enforcing the mode for a callee in
    ``namespace``; None when the mode checks no identity.

    A DENY of every principal the mode does not admit, rather than an ALLOW of
    those it does: Envoy then names the policy in the reply's code details
    (``rbac_access_denied_matched_policy[mode-NAMESPACE]``), which is how the
    listener's local-reply mapper tells the mode's 403 from any other."""
    matchers = admitted(setting, trust_domain, namespace)
    if matchers is None:
        return None
    ids = [{"authenticated": {"principalName": m}} for m in matchers]
    refused = {"notId": {"orIds": {"ids": ids}}} if ids else {"any": True}
    return {
        "@type": _RBAC_PER_ROUTE,
        "rbac": {
            "rulesStatPrefix": MODE_STAT_PREFIX,
            "rules": {
                "action": "DENY",
                "policies": {
                    POLICY_PREFIX + setting.mode: {
                        "permissions": [{"any": True}],
                        "principals": [refused],
                    }
                },
            },
        },
    }


#: The listener's mode filter: no rules of its own, so it admits everything
#: unless the route carries the mode (:func:`mode_route_config`). It is always
#: there, so a change of mode or membership is a route update (RDS), which
#: applies to open connections too; a listener update would only reach new ones.
MODE_LISTENER_FILTER: JsonDict = {
    "name": MODE_FILTER,
    "typedConfig": {"@type": _RBAC, "rulesStatPrefix": MODE_STAT_PREFIX},
}


@dataclass(frozen=True)
class InboundAuthz:
    """What the inbound listener and its route carry for the workload's setting."""

    http_filters: list[JsonDict]
    route_config: JsonDict  # typedPerFilterConfig of the inbound route
    route_metadata: JsonDict  # the inbound route's metadata (the mode's name)
    clusters: list[JsonDict]


def compile_inbound(
    settings: Sequence[MeshSetting],
    trust_domain: str,
    namespace: str,
    knobs: envoy_config.GatewaySettings,
) -> InboundAuthz:
    """The filters, route config and clusters of a callee in ``namespace``.

    ``knobs`` are the cluster's ext_authz timeout and failure mode, the same
    the gateways use.
    """
    setting = setting_for(settings, namespace)
    if setting is None:
        return InboundAuthz([MODE_LISTENER_FILTER], {}, {}, [])
    route: JsonDict = {}
    mode = mode_route_config(setting, trust_domain, namespace)
    if mode is not None:
        route[MODE_FILTER] = mode
    metadata = {
        "filterMetadata": {ROUTE_METADATA_KEY: {"mode": setting.mode, "setting": setting.setting}}
    }
    if setting.ext_authz is None or setting.mode == "DISABLED":
        return InboundAuthz([MODE_LISTENER_FILTER], route, metadata, [])
    document = envoy_config.render(
        envoy_config.EnvoyConfigInput(
            cluster_fqn="",
            cluster="",
            traffic_policies=(),
            ext_authz=(setting.ext_authz,),
            gateway=dataclasses.replace(knobs, tracing=None),
        )
    )
    if document["routes"]:
        route.update(document["routes"][0]["typedPerFilterConfig"])
    return InboundAuthz(
        [MODE_LISTENER_FILTER, *document["httpFilters"]],
        route,
        metadata,
        list(document["clusters"]),
    )
