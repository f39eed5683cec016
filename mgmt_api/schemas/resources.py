"""Records shared by several kinds and endpoints.

Each kind's own model lives with its behaviour in :mod:`mgmt_api.kinds`. One
model per kind serves input and output: output-only fields (``fqn``,
``etag`` on create, times, and each kind's ``KindDef.output_only``) are
accepted in a request body, so a client can PUT back what it GOT, and are
then ignored: the service never stores them from user input.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from mgmt_api.schemas.base import ROLE_PATTERN, ApiModel, RequiredEtag

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


class NamespaceSelector(ApiModel):
    names: list[str] = Field(
        description=(
            "cluster/namespace patterns: '*' for a whole segment, trailing '*' on the namespace."
        ),
        min_length=1,
        max_length=1000,
    )


class KeyPair(ApiModel):
    id: str
    public_key: str
    private_key: str | None = Field(default=None, description="Returned once, when generated.")
    encoding: Literal["PEM", "JWK"] = "PEM"


class Locality(ApiModel):
    region: str


class NamespaceScoping(ApiModel):
    scope: Literal["GLOBAL", "LOCAL"] | None = None
    exceptions: list[str] | None = None


class GatewayTemplate(ApiModel):
    """A gateway Envoy's bootstrap (``secrets.bootstrap``: it carries a token) and its ADS."""

    message: str
    ads: str = Field(description="grpc:// or grpcs:// address of mgmt-api's ADS (gRPC port).")
    token_expire_time: str = Field(description="RFC 3339: when the bootstrap's token expires.")
    secrets: dict[str, Any]


class InstallTemplate(ApiModel):
    message: str
    helm: dict[str, Any]
    gateway: GatewayTemplate | None = Field(
        default=None, description="Absent when mgmt-api serves no gRPC port it can name."
    )


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
    """Cluster-level rate-limit switches (docs/api.md, "Clusters"): counter store,
    failure mode, and the gateway filter's timeout.

    ``failureMode`` uses the ratelimit service's names: ``unavailable`` (the
    call fails and Envoy's ``failure_mode_deny`` decides), ``allow``, ``deny``.
    It is also the gateway's fail-open/fail-closed switch: ``deny`` renders
    ``failureModeDeny: true`` (fail closed), the others fail open.

    ``timeout`` is the gateway rate-limit filter's: rendered 100 ms when unset,
    because Envoy's own 20 ms default fires under load and lets requests
    bypass their limits (Envoy Gateway issues #1655, #6487).
    """

    redis: RedisSwitch | None = None
    backend: RateLimitBackend | None = None
    failure_mode: Literal["unavailable", "allow", "deny"] | None = None
    timeout: str | None = Field(
        default=None,
        description="Gateway rate-limit filter timeout, 1ms..60s (e.g. '100ms', '0.25s'); "
        "default 100ms. Stored as protobuf seconds ('0.1s').",
    )


class ClusterExtAuthz(ApiModel):
    """The gateway ext_authz filter's knobs for a cluster.

    Closed by default: an authorization outage answers 503 and lets nothing
    through unless ``failureModeAllow`` says otherwise.
    """

    timeout: str | None = Field(
        default=None,
        description="ext_authz call timeout, 1ms..60s; default 200ms. Stored as protobuf "
        "seconds ('0.2s').",
    )
    failure_mode_allow: bool | None = Field(
        default=None, description="Let requests through when ext_authz fails; default false."
    )


_MAX_THRESHOLD = 2**31 - 1  # Envoy takes a UInt32Value; JSON clients an int32


class CircuitBreakers(ApiModel):
    """Envoy circuit-breaker thresholds for the upstream (backend) clusters of the
    cluster's gateways, so an upstream that cannot keep up gives 503 (spec
    4.10.7), not a 429. Unset fields keep Envoy's defaults (1024, 1024, 1024, 3).
    """

    max_connections: int | None = Field(default=None, ge=1, le=_MAX_THRESHOLD)
    max_pending_requests: int | None = Field(default=None, ge=1, le=_MAX_THRESHOLD)
    max_requests: int | None = Field(default=None, ge=1, le=_MAX_THRESHOLD)
    max_retries: int | None = Field(default=None, ge=1, le=_MAX_THRESHOLD)


class ClusterTracing(ApiModel):
    """Envoy's OpenTelemetry tracer on the cluster's gateways (and sidecars):
    spans go over OTLP/gRPC to ``collector``; ``samplingPercentage`` (0-100,
    default 1) of requests arriving without a sampling decision are traced.
    See mgmt_api/compiler/tracing.py and docs/observability.md."""

    collector: str = Field(description="grpc://host:port or unix:///path of an OTLP collector")
    sampling_percentage: float = Field(default=1.0, ge=0, le=100)


class ResourceType(ApiModel):
    api_group: str = "api.meshplane.io/v2"
    kinds: list[str] | None = None


class RoleRule(ApiModel):
    types: list[ResourceType] | None = None
    permissions: list[Permission] = Field(min_length=1)


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
    ext_authz: ClusterExtAuthz | None = None
    circuit_breakers: CircuitBreakers | None = None
    tracing: ClusterTracing | None = None
    revision: int = Field(description="Store revision this config was read at.")


class Subject(ApiModel):
    user: str | None = None
    team: str | None = None
    service_account: str | None = None


class Binding(ApiModel):
    role: str = Field(pattern=ROLE_PATTERN, description="A role: rbac/admin, rbac/editor, ...")
    subjects: list[Subject] = Field(default_factory=list)


class AccessPolicy(ApiModel):
    fqn: str | None = Field(default=None, description="Output only.")
    description: str | None = None
    etag: str | None = Field(default=None, description="Required on PUT.")
    allow: list[Binding] = Field(default_factory=list)


class SetAccessPolicyRequest(AccessPolicy):
    """The body of a policy PUT: the policy, with the etag last read."""

    etag: RequiredEtag


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
