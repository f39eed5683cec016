"""Resource models. One model per kind serves input and output.

Output-only fields (``fqn``, ``etag`` on create, times, ``namespaces``,
``state``, ``installTemplate``, ``serviceAccount``, ``keys``, ``sourceType``)
are accepted in a request body, so a client can PUT back what it GOT, and are
then ignored: the service never stores them from user input.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from mgmt_api.schemas.base import ApiModel

Permission = Literal["READ", "WRITE", "CREATE", "DELETE", "SET_POLICY"]


class ConfigGenerationMetadata(ApiModel):
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None


class Meta(ApiModel):
    fqn: str | None = Field(default=None, description="Output only.")
    display_name: str | None = Field(default=None, max_length=256)
    description: str | None = Field(default=None, max_length=4096)
    etag: str | None = Field(default=None, description="Computed; required on update.")
    create_time: str | None = Field(default=None, description="Output only, RFC 3339.")
    update_time: str | None = Field(default=None, description="Output only, RFC 3339.")
    labels: dict[str, str] | None = None


class Organization(Meta):
    deletion_protection_enabled: bool | None = None
    profiles: list[str] | None = None
    system_namespaces: list[str] | None = None
    config_generation_metadata: ConfigGenerationMetadata | None = None


class Tenant(Meta):
    deletion_protection_enabled: bool | None = None
    security_domain: str | None = None
    profiles: list[str] | None = None
    config_generation_metadata: ConfigGenerationMetadata | None = None


class NamespaceSelector(ApiModel):
    names: list[str] = Field(
        description=(
            "cluster/namespace patterns: '*' for a whole segment, trailing '*' on the namespace."
        ),
        max_length=1000,
    )


class Workspace(Meta):
    namespace_selector: NamespaceSelector | None = None
    privileged: bool | None = None
    deletion_protection_enabled: bool | None = None
    security_domain: str | None = None
    profiles: list[str] | None = None
    config_generation_metadata: ConfigGenerationMetadata | None = None


class SecurityGroup(Meta):
    namespace_selector: NamespaceSelector | None = None
    config_mode: Literal["BRIDGED", "DIRECT"] | None = None
    deletion_protection_enabled: bool | None = None
    config_generation_metadata: ConfigGenerationMetadata | None = None


class Profile(Meta):
    """Settings attached to organizations, tenants and workspaces (spec §4.6).

    ``defaults`` may be overridden by later profiles or the object's own
    value; ``mandates`` never are. Both are free-form settings objects whose
    keys are dot-joined into setting paths by blame.
    """

    deletion_protection_enabled: bool | None = None
    defaults: dict[str, Any] | None = Field(default=None, description="Overridable settings.")
    mandates: dict[str, Any] | None = Field(default=None, description="Enforced settings.")


class User(Meta):
    login_name: str | None = None
    first_name: str | None = None
    last_name: str | None = None
    email: str | None = None
    source_type: Literal["LDAP", "LOCAL", "AZURE", "MANUAL"] | None = Field(
        default=None, description="Output only."
    )
    password: str | None = Field(
        default=None,
        description="Write-only. Sets the local password (needs SET_POLICY on the user).",
        json_schema_extra={"writeOnly": True},
    )


class Team(Meta):
    members: list[str] | None = Field(
        default=None, description="FQNs of users and service accounts."
    )
    source_type: Literal["LDAP", "LOCAL", "AZURE", "MANUAL"] | None = Field(
        default=None, description="Output only."
    )


class KeyPair(ApiModel):
    id: str
    public_key: str
    private_key: str | None = Field(default=None, description="Returned once, when generated.")
    encoding: Literal["PEM", "JWK"] = "PEM"


class ServiceAccount(Meta):
    keys: list[KeyPair] | None = Field(default=None, description="Output only.")


class Locality(ApiModel):
    region: str


class NamespaceScoping(ApiModel):
    scope: Literal["GLOBAL", "LOCAL"] | None = None
    exceptions: list[str] | None = None


class InstallTemplate(ApiModel):
    message: str
    helm: dict[str, Any]


class SecretRef(ApiModel):
    """A Kubernetes Secret in the cluster (resolved there, never stored here)."""

    name: str
    namespace: str | None = None


class RedisTls(ApiModel):
    certificate_ref: SecretRef | None = None


class RedisBackend(ApiModel):
    url: str | None = Field(default=None, description="redis:// or rediss:// URL")
    url_ref: SecretRef | None = Field(default=None, description="Secret holding the URL")
    tls: RedisTls | None = None


class RateLimitBackend(ApiModel):
    type: Literal["Redis"] = "Redis"
    redis: RedisBackend | None = None


class RedisSwitch(ApiModel):
    disabled: bool = False


class ClusterRateLimit(ApiModel):
    """Cluster-level rate-limit switches (spec §2.9): counter store and failure mode.

    ``failureMode`` uses the ratelimit service's names: ``unavailable`` (the
    call fails and Envoy's ``failure_mode_deny`` decides), ``allow``, ``deny``.
    """

    redis: RedisSwitch | None = None
    backend: RateLimitBackend | None = None
    failure_mode: Literal["unavailable", "allow", "deny"] | None = None


class Cluster(Meta):
    token_ttl: str | None = Field(default=None, description="Join-token lifetime, default 3600s.")
    network: str | None = None
    tier1_cluster: bool | None = None
    locality: Locality | None = None
    trust_domain: str | None = None
    namespace_scope: NamespaceScoping | None = None
    deletion_protection_enabled: bool | None = None
    config_generation_metadata: ConfigGenerationMetadata | None = None
    rate_limit: ClusterRateLimit | None = None
    namespaces: list[dict[str, Any]] | None = Field(
        default=None, description="Output only (agents)."
    )
    state: dict[str, Any] | None = Field(default=None, description="Output only (agents).")
    service_account: ServiceAccount | None = Field(default=None, description="Output only.")
    install_template: InstallTemplate | None = Field(default=None, description="Output only.")


NamespaceDesiredState = Literal["DESIRED_ONBOARDED", "DESIRED_OFFBOARDED"]


class NamespaceConfig(ApiModel):
    name: str = Field(max_length=63, description="A namespace of the cluster (DNS-1123 label).")
    desired_state: NamespaceDesiredState


class ClusterOnboardingConfig(Meta):
    """Desired onboarding state per namespace of one cluster (spec 2.3); one per cluster."""

    namespaces: list[NamespaceConfig] = Field(max_length=1000)


class BackendTrafficPolicy(Meta):
    """Envoy Gateway's BackendTrafficPolicy (spec §2.6), stored per cluster.

    ``metadata`` and ``spec`` are validated by
    :class:`mgmt_api.compiler.traffic_policy.BackendTrafficPolicy`, the same
    model the compiler reads, so what the API accepts is what it can compile.
    """

    api_version: str | None = Field(default=None, description="gateway.envoyproxy.io/v1alpha1")
    kind: str | None = Field(default=None, description="BackendTrafficPolicy")
    metadata: dict[str, Any] | None = Field(
        default=None, description="{name, namespace}; default: from the FQN segment ns.name."
    )
    spec: dict[str, Any] = Field(description="{targetRef, rateLimit{type: Global, global.rules}}")


AuthorizationMode = Literal[
    "UNSET", "NAMESPACE", "GROUP", "WORKSPACE", "CLUSTER", "DISABLED", "CUSTOM", "RULES"
]


class ExternalAuthorization(ApiModel):
    uri: str = Field(description="grpc://host:port of the ext_authz server.")
    policy: str | None = Field(
        default=None,
        description="Name of an ExtAuthzPolicy of the same security group to enforce.",
    )
    include_request_headers_in_check: list[str] | None = None


class HttpAuthorization(ApiModel):
    external: ExternalAuthorization | None = None


class AuthorizationSettings(ApiModel):
    mode: AuthorizationMode = "UNSET"
    http: HttpAuthorization | None = None


class SecuritySetting(Meta):
    """A security group's settings (spec §2.7); only authorization is modelled."""

    authorization: AuthorizationSettings | None = None


class ExtAuthzPolicy(Meta):
    """One ext_authz JWT policy, in the schema of an entry of the ext_authz
    config file's ``policies`` list without ``name`` (the server names it)."""

    jwt: dict[str, Any] = Field(
        description="{algorithms, keys, leewaySeconds, issuer, audiences} as in docs/extauthz.md"
    )
    path_claim: dict[str, Any] | None = Field(default=None, description="{name, match}")
    remove_authorization: bool | None = None
    claims_to_headers: list[dict[str, Any]] | None = None


class ResourceType(ApiModel):
    api_group: str = "api.meshplane.io/v2"
    kinds: list[str] | None = None


class RoleRule(ApiModel):
    types: list[ResourceType] | None = None
    permissions: list[Permission] = Field(min_length=1)


class Role(Meta):
    rules: list[RoleRule] | None = None


class ClusterConfig(ApiModel):
    """Settings a cluster's control plane syncs from the management plane."""

    cluster: str
    tier1_cluster: bool
    token_ttl: str
    network: str | None = None
    trust_domain: str | None = None
    namespace_scope: NamespaceScoping | None = None
    system_namespaces: list[str]
    config_generation_metadata: ConfigGenerationMetadata | None = None
    rate_limit: ClusterRateLimit | None = None
    revision: int = Field(description="Store revision this config was read at.")


class Subject(ApiModel):
    user: str | None = None
    team: str | None = None
    service_account: str | None = None


class Binding(ApiModel):
    role: str
    subjects: list[Subject] = Field(default_factory=list)


class AccessPolicy(ApiModel):
    fqn: str | None = Field(default=None, description="Output only.")
    description: str | None = None
    etag: str | None = Field(default=None, description="Required on PUT.")
    allow: list[Binding] = Field(default_factory=list)


class PermissionRule(ApiModel):
    permissions: list[Permission]


class ResourcePermissions(ApiModel):
    fqn: str
    rules: list[PermissionRule]


class TokenResponse(ApiModel):
    access_token: str
    token_type: Literal["Bearer"] = "Bearer"  # noqa: S105 - a scheme name
    expires_in: int
    subject: str


class OidcConfiguration(ApiModel):
    enabled: bool


class AuditLog(ApiModel):
    id: str
    create_time: str
    kind: str
    operation: str
    fqn: str
    triggered_by: str
    message: str
    properties: dict[str, Any]


class AuditLogList(ApiModel):
    audit_logs: list[AuditLog]
    next_page_token: str = ""


class Jwks(ApiModel):
    keys: list[dict[str, Any]]
