"""Cluster: a Kubernetes-style cluster, its components' accounts and its onboarding.

Creating a cluster also creates one service account per component that
talks to mgmt-api (``{cluster}/serviceaccounts/{agent,gateway,extauthz,ratelimit}``,
:data:`mgmt_api.domain.cluster_accounts.ACCOUNTS`, which also says what each
key opens), mints a first key of each and returns the install template with
those keys, in the same transaction; no private key is stored. None of the
accounts gets a role. Creating one needs SET_POLICY on the organization
besides CREATE, as does a GET with ``includeInstallTemplate=true``, which
mints a new key of each (creating the accounts a cluster made before some
of them existed lacks): keys of a cluster's accounts are managed on the
organization (:func:`~mgmt_api.kinds.service_account.key_scope`,
:data:`CREATE_ACCOUNTS`, :data:`INSTALL_TEMPLATE`).

``namespaces`` and ``state`` are what the cluster's agent last reported
(output only); ``fetchWorkloads`` includes the reported workloads, which are
costly to return. ``rateLimit`` holds the cluster's counter-store switches
(docs/api.md); a ``backend.redis.url`` written as ``host:port`` is stored as the
``redis://host:port`` URL it means, so every reader sees one form.
``rateLimit.timeout``, ``extAuthz`` and ``circuitBreakers`` are the knobs of
the cluster's gateway filters (``mgmt_api.compiler.envoy_config.GatewaySettings``);
timeouts are stored as protobuf seconds (``"100ms"`` as ``"0.1s"``), as
``tokenTtl`` is, so the renderer reads one form.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Annotated, Any
from urllib.parse import urlsplit

from fastapi import Query
from pydantic import Field
from sqlalchemy.engine import Connection

from agent.contract import MAX_JWKS_BYTES
from meshplane import gateway_contract
from meshplane.control_plane import ServiceAccountKey
from meshplane.kinds_contract import Kind
from mgmt_api import fqn as fqnmod
from mgmt_api.auth import keys as keymod
from mgmt_api.compiler import tracing
from mgmt_api.compiler.envoy_config import MAX_TIMEOUT_SECONDS, MIN_TIMEOUT_SECONDS
from mgmt_api.domain import cluster_accounts as accounts
from mgmt_api.domain import inventory, mesh_ca, workload_attest
from mgmt_api.domain.durations import format_duration, parse_duration
from mgmt_api.domain.times import rfc3339
from mgmt_api.errors import ApiError, Code, invalid
from mgmt_api.kinds import onboarding
from mgmt_api.kinds.base import (
    GET,
    LIST,
    AccessGrant,
    Behaviour,
    KindDef,
    QueryOptions,
    RenderEnv,
    RouteParam,
    Write,
    WriteEnv,
    create_object,
    render_common,
)
from mgmt_api.kinds.service_account import ServiceAccount, key_scope, key_view, new_key
from mgmt_api.schemas.base import ApiModel, QueryBool
from mgmt_api.schemas.resources import (
    CircuitBreakers,
    ClusterExtAuthz,
    ClusterRateLimit,
    ClusterTracing,
    ConfigGenerationMetadata,
    InstallTemplate,
    Locality,
    Meta,
    NamespaceScoping,
)
from mgmt_api.store import repo
from ratelimit.contract import RedisUrlError, parse_redis_url

DEFAULT_TOKEN_TTL = "3600s"  # noqa: S105 - a duration
#: node.id of the install template's gateway; each gateway of a cluster needs its own.
GATEWAY_INSTANCE = "gateway-1"
#: trusted_ca of a grpcs:// ADS address: the system bundle of Debian/Ubuntu (and of
#: Envoy's images), right for a publicly signed mgmt-api certificate.
GATEWAY_CA_FILE = "/etc/ssl/certs/ca-certificates.crt"

FETCH_WORKLOADS = RouteParam(
    "fetch_workloads",
    Annotated[QueryBool, Query(alias="fetchWorkloads", description="Include reported workloads.")],
    False,
    frozenset({LIST, GET}),
)
INCLUDE_INSTALL_TEMPLATE = RouteParam(
    "include_install_template",
    Annotated[
        QueryBool,
        Query(
            alias="includeInstallTemplate",
            description=(
                "Mints a new key of each of the cluster's accounts; needs SET_POLICY "
                "on the organization."
            ),
        ),
    ],
    False,
    frozenset({GET}),
)


_ACCOUNTS_ON = "the organization (where the cluster accounts' keys are managed)"


def _key_scope_of(name: str) -> Callable[[Connection, str, str], list[tuple[str, str]]]:
    def targets(conn: Connection, cluster_fqn: str, kind: str) -> list[tuple[str, str]]:
        return [key_scope(accounts.account_fqn(cluster_fqn, name))]

    return targets


def _grant(operation: str, account: accounts.Account) -> AccessGrant:
    opens = " and the ".join(sorted(c.title for c in account.channels))
    return AccessGrant(
        "Cluster",
        operation.format(name=account.name),
        f"the key acts as {account.description}: it opens the {opens}",
        on=_ACCOUNTS_ON,
        targets=_key_scope_of(account.name),
    )


#: Creating a cluster creates each account and mints its first key.
CREATE_ACCOUNTS = tuple(
    _grant("create (creates the {name} account, mints its key)", a) for a in accounts.ACCOUNTS
)
#: ``includeInstallTemplate`` mints a new key of each account.
INSTALL_TEMPLATE = tuple(
    _grant("GET ?includeInstallTemplate=true (mints a key of the {name} account)", a)
    for a in accounts.ACCOUNTS
)

WORKLOAD_ISSUERS = AccessGrant(
    "Cluster",
    "workloadIdentity.issuers",
    "a token its keys sign proves a workload identity: it gets that workload's certificate "
    "and endpoints",
    field=("workloadIdentity", "issuers"),
)


class WorkloadIssuer(ApiModel):
    issuer: str = Field(description="The tokens' iss (a URL).")
    jwks: dict[str, Any] = Field(description='{"keys": [public JWKs]}: RSA or EC, no private part.')


class WorkloadIdentity(ApiModel):
    issuers: list[WorkloadIssuer] | None = Field(
        default=None,
        description=(
            "Service-account token issuers whose tokens prove a workload of this cluster "
            "(besides the one its agent reports): for workloads outside Kubernetes. At most "
            f"{workload_attest.MAX_ISSUERS}, each JWKS at most "
            f"{MAX_JWKS_BYTES // 1024} KiB."
        ),
    )


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
    ext_authz: ClusterExtAuthz | None = None
    circuit_breakers: CircuitBreakers | None = None
    tracing: ClusterTracing | None = None
    workload_identity: WorkloadIdentity | None = None
    namespaces: list[dict[str, Any]] | None = Field(
        default=None, description="Output only (agents)."
    )
    state: dict[str, Any] | None = Field(default=None, description="Output only (agents).")
    service_account: ServiceAccount | None = Field(default=None, description="Output only.")
    install_template: InstallTemplate | None = Field(default=None, description="Output only.")


def redis_url(value: str) -> str:
    """The Redis URL a ``backend.redis.url`` means: the API reference writes ``<host>:<port>``
    (as Envoy Gateway's ``redis.url`` does); a ``redis://``/``rediss://`` URL is taken
    as it is."""
    return value if "://" in value else f"redis://{value}"


def _rate_limit(prefix: str, rate_limit: dict[str, Any] | None) -> None:
    """The counter store is Redis unless ``redis.disabled`` (then in memory, per
    instance); with Redis, exactly one of ``url`` and ``urlRef`` says where."""
    if not rate_limit:
        return
    disabled = bool((rate_limit.get("redis") or {}).get("disabled"))
    redis = (rate_limit.get("backend") or {}).get("redis")
    if disabled:
        if redis is not None:
            raise invalid(f"{prefix}.backend.redis", "must be empty when redis.disabled is true")
        return
    if rate_limit.get("backend") is None:
        return
    redis = redis or {}
    if ("url" in redis) == ("urlRef" in redis):
        raise invalid(f"{prefix}.backend.redis", "give exactly one of url and urlRef")
    if "url" in redis:
        url = redis_url(redis["url"])
        try:
            parse_redis_url(url)
        except RedisUrlError as exc:
            raise invalid(f"{prefix}.backend.redis.url", str(exc)) from None
        if urlsplit(url).password is not None:
            # Every reader of the cluster would see it: secrets go in urlRef.
            raise invalid(
                f"{prefix}.backend.redis.url", "must not carry a password; use urlRef (a Secret)"
            )
        redis["url"] = url
    for ref_field in ("urlRef", "tls.certificateRef"):
        ref = redis
        for part in ref_field.split("."):
            ref = (ref or {}).get(part)
        if ref is not None:
            fqnmod.validate_name(ref["name"], f"{prefix}.backend.redis.{ref_field}.name")
            if ref.get("namespace") is not None:
                fqnmod.validate_name(
                    ref["namespace"], f"{prefix}.backend.redis.{ref_field}.namespace"
                )


def _workload_issuers(prefix: str, section: dict[str, Any] | None) -> None:
    """At most :data:`~mgmt_api.domain.workload_attest.MAX_ISSUERS` issuers, each once,
    each a public JWKS within the caps (a private member is refused: it would be
    stored and read back by every reader of the cluster)."""
    issuers = (section or {}).get("issuers") or []
    if len(issuers) > workload_attest.MAX_ISSUERS:
        raise invalid(prefix, f"at most {workload_attest.MAX_ISSUERS} issuers")
    seen: set[str] = set()
    for i, issuer in enumerate(issuers):
        problem = workload_attest.issuer_problem(issuer)
        if problem is not None:
            member, message = problem
            raise invalid(f"{prefix}[{i}].{member}".rstrip("."), message)
        if issuer["issuer"] in seen:
            raise invalid(f"{prefix}[{i}].issuer", f"{issuer['issuer']!r} is given twice")
        seen.add(issuer["issuer"])


def filter_timeout(section: dict[str, Any] | None, field: str) -> None:
    """Normalize ``section["timeout"]`` (``"100ms"``, ``"0.25s"``) to protobuf seconds.

    Bounded to 1ms..60s: below a millisecond no call can answer, and a gateway
    holding a request a minute for a policy decision is a misconfiguration.
    Sub-millisecond digits are refused rather than rounded away.
    """
    if not section or section.get("timeout") is None:
        return
    seconds = parse_duration(section["timeout"], field)
    if not MIN_TIMEOUT_SECONDS <= seconds <= MAX_TIMEOUT_SECONDS:
        raise invalid(field, "must be between 1ms and 60s")
    if abs(seconds * 1000 - round(seconds * 1000)) > 1e-6:
        raise invalid(field, "must be a whole number of milliseconds")
    section["timeout"] = format_duration(round(seconds * 1000) / 1000)


def strip_workloads(namespaces: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Namespaces without ``services[].workloads`` (fetchWorkloads=false)."""
    out = []
    for ns in namespaces:
        ns2 = dict(ns)
        if "services" in ns2:
            ns2["services"] = [
                {k: v for k, v in s.items() if k != "workloads"} for s in ns2["services"]
            ]
        out.append(ns2)
    return out


def gateway_template(
    ads: str, cluster: repo.Resource, sa_fqn: str, pair: keymod.KeyPair
) -> dict[str, Any]:
    """A ready-to-run bootstrap for one gateway Envoy of ``cluster``, reaching ADS at ``ads``.

    Its token is signed with the freshly minted key of the cluster's gateway
    account (Envoy cannot sign tokens, so it carries one of
    :data:`gateway_contract.GATEWAY_TOKEN_TTL_SECONDS`, valid only with the ADS
    audience): deleting the key revokes it. The
    bootstrap sits under ``secrets`` because it is one, as the key is.
    """
    now = time.time()
    token = ServiceAccountKey(pair.private_jwk, sa_fqn, cluster.fqn).token(
        now=now,
        ttl=gateway_contract.GATEWAY_TOKEN_TTL_SECONDS,
        audience=gateway_contract.XDS_AUDIENCE,
    )
    node = gateway_contract.GatewayNode(
        fqnmod.org_name(cluster.fqn), cluster.name, GATEWAY_INSTANCE
    )
    tls = gateway_contract.grpc_address(ads, "the ADS address")[2]
    bootstrap = gateway_contract.bootstrap(
        node, ads=ads, token=token, ca_file=GATEWAY_CA_FILE if tls else None
    )
    expires = int(now) + gateway_contract.GATEWAY_TOKEN_TTL_SECONDS
    return {
        "message": (
            "Run a gateway Envoy with secrets.bootstrap as its bootstrap (envoy -c FILE; keep "
            "the file mode 0600). Its token expires at tokenExpireTime: fetch the template "
            "again before then. Give each gateway its own node.id; node.metadata sets its "
            "listener, its name (HTTPRoute parentRefs) and the rate-limit service."
            + (
                f" With grpcs, trusted_ca is {GATEWAY_CA_FILE}: point it at the CA of "
                "mgmt-api's certificate if that is a private one."
                if tls
                else ""
            )
        ),
        "ads": ads,
        "tokenExpireTime": rfc3339(expires * 1_000_000),
        "secrets": {"bootstrap": bootstrap},
    }


def credential(cluster: repo.Resource, sa_fqn: str, pair: keymod.KeyPair) -> dict[str, str]:
    """One account's key as the template hands it out (what ``--credentials`` reads)."""
    return {
        "clusterFqn": cluster.fqn,
        "serviceAccountFqn": sa_fqn,
        "keyId": pair.id,
        "jwk": json.dumps(pair.private_jwk, separators=(",", ":")),
        "encodedJwk": keymod.encode_jwk(pair.private_jwk),
    }


def install_template(
    base_url: str,
    cluster: repo.Resource,
    keys: dict[str, keymod.KeyPair],
    ads: str | None = None,
) -> dict[str, Any]:
    """Minimal values to install the cluster's components, and its gateway when ``ads``
    is known; carries a new key of each account (and a gateway token made with the
    gateway's), never stored. ``keys``: account name -> its new key."""
    url = urlsplit(base_url)
    port = url.port or (443 if url.scheme == "https" else 80)
    gateway_fqn = accounts.account_fqn(cluster.fqn, "gateway")
    gateway = (
        {"gateway": gateway_template(ads, cluster, gateway_fqn, keys["gateway"])} if ads else {}
    )
    secrets = {
        a.template_secret: credential(
            cluster, accounts.account_fqn(cluster.fqn, a.name), keys[a.name]
        )
        for a in accounts.ACCOUNTS
    }
    return {
        "message": (
            "Install the meshplane cluster components with these values. Each component's "
            "API key (secrets.clusterServiceAccount: the agent's; secrets."
            "gatewayServiceAccount, extauthzServiceAccount, ratelimitServiceAccount) "
            "is shown only now; fetching the template again mints new keys."
        ),
        "helm": {
            "operator": {"deletionProtection": "disabled", "controlPlaneMode": "CONTROL"},
            "secrets": secrets,
            "spec": {
                "managementPlane": {
                    "url": base_url.rstrip("/"),
                    "host": url.hostname or "",
                    "port": port,
                    "clusterName": cluster.name,
                    "selfSigned": url.scheme == "https",
                },
                "tier1Cluster": bool(cluster.spec.get("tier1Cluster")),
                "tokenTtl": cluster.spec.get("tokenTtl", DEFAULT_TOKEN_TTL),
            },
        },
        **gateway,
    }


def _mint_keys(env: WriteEnv, cluster: repo.Resource) -> dict[str, keymod.KeyPair]:
    """A new key of each of the cluster's accounts, creating the accounts it lacks (a
    cluster created before some of them existed, or an account deleted since). None of
    them gets a role: what each key opens is the table of ``cluster_accounts``."""
    keys = {}
    for account in accounts.ACCOUNTS:
        sa_fqn = accounts.account_fqn(cluster.fqn, account.name)
        if not repo.exists(env.tx.conn, sa_fqn):
            spec = {
                "displayName": f"{account.name.capitalize()} of {cluster.name}",
                "description": f"Credential of {account.description}",
            }
            if create_object(env, Kind.SERVICE_ACCOUNT, sa_fqn, spec) is None:
                raise ApiError(
                    Code.ALREADY_EXISTS, f"{sa_fqn} already exists", metadata={"fqn": sa_fqn}
                )
        keys[account.name] = new_key(env.tx.conn, sa_fqn)
    return keys


def _create_accounts(env: WriteEnv, cluster: repo.Resource) -> dict[str, Any]:
    """The cluster's accounts, their first keys and the template; ``serviceAccount``
    shows the agent's account with its key."""
    keys = _mint_keys(env, cluster)
    agent = keys[fqnmod.AGENT_SERVICE_ACCOUNT]
    account = repo.get(env.tx.conn, fqnmod.agent_fqn(cluster.fqn))
    assert account is not None  # created just now
    account_view = render_common(account)
    account_view["keys"] = [key_view(agent.id, agent.public_jwk, "PEM", agent)]
    return {
        "serviceAccount": account_view,
        "installTemplate": install_template(
            env.base_url, cluster, keys, env.settings.ads_url(env.base_url)
        ),
    }


class ClusterBehaviour(Behaviour):
    route_params = (FETCH_WORKLOADS, INCLUDE_INSTALL_TEMPLATE)
    grants = (*CREATE_ACCOUNTS, *INSTALL_TEMPLATE, WORKLOAD_ISSUERS)

    def validate(self, write: Write) -> None:
        spec = write.spec
        _rate_limit(f"{write.prefix}.rateLimit", spec.get("rateLimit"))
        filter_timeout(spec.get("rateLimit"), f"{write.prefix}.rateLimit.timeout")
        filter_timeout(spec.get("extAuthz"), f"{write.prefix}.extAuthz.timeout")
        problem = tracing.validate(spec.get("tracing"), f"{write.prefix}.tracing")
        if problem is not None:
            field, _, message = problem.partition(": ")
            raise invalid(field, message)
        if spec.get("trustDomain") is not None:
            try:
                mesh_ca.validate_trust_domain(spec["trustDomain"])
            except mesh_ca.TrustDomainError as exc:
                raise invalid(f"{write.prefix}.trustDomain", str(exc)) from None
        _workload_issuers(f"{write.prefix}.workloadIdentity.issuers", spec.get("workloadIdentity"))
        ttl = spec.get("tokenTtl")
        seconds = parse_duration(ttl, f"{write.prefix}.tokenTtl") if ttl is not None else 3600.0
        spec["tokenTtl"] = format_duration(seconds)
        spec.setdefault("tier1Cluster", False)

    def authorize(self, env: WriteEnv, write: Write) -> None:
        if write.creating:
            for grant in CREATE_ACCOUNTS:
                grant.require(env.tx.conn, env.principal, write.fqn)

    def after_write(self, env: WriteEnv, write: Write, res: repo.Resource) -> dict[str, Any]:
        return _create_accounts(env, res) if write.creating else {}

    def before_delete(self, env: WriteEnv, fqn: str) -> None:
        onboarding.offboard_cluster(env, fqn)
        res = repo.get(env.tx.conn, fqn)
        if res is not None:  # its mesh CAs go with it (docs/mesh.md)
            repo.kv_delete_prefix(env.tx.conn, mesh_ca.store_prefix(fqn, res.create_time))

    def render(self, res: repo.Resource, env: RenderEnv) -> dict[str, Any]:
        out = render_common(res)
        namespaces = res.status.get("namespaces") or []
        out["namespaces"] = (
            namespaces if env.options.get("fetch_workloads") else strip_workloads(namespaces)
        )
        if res.status.get("state"):
            out["state"] = inventory.state_view(
                res.status, env.now_us, env.settings.stale_after_seconds
            )
        return out

    def read_writes(self, options: QueryOptions) -> bool:
        return bool(options.get("include_install_template"))

    def on_read_write(
        self, env: WriteEnv, res: repo.Resource, options: QueryOptions
    ) -> dict[str, Any]:
        """``includeInstallTemplate``: a new key of each account and the template carrying them."""
        for grant in INSTALL_TEMPLATE:
            grant.require(env.tx.conn, env.principal, res.fqn)
        keys = _mint_keys(env, res)
        for name, pair in keys.items():
            env.tx.audit(
                accounts.account_fqn(res.fqn, name),
                Kind.SERVICE_ACCOUNT,
                "GENERATE_KEY",
                f"install template requested for {res.fqn}",
                keyId=pair.id,
            )
        ads = env.settings.ads_url(env.base_url)
        return {"installTemplate": install_template(env.base_url, res, keys, ads)}


KIND = KindDef(Kind.CLUSTER, Cluster, behaviour=ClusterBehaviour(), protectable=True)
