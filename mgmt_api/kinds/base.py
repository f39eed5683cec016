"""What a kind is: its REST shape (:class:`KindDef`) and its behaviour (:class:`Behaviour`).

The generic CRUD (:mod:`mgmt_api.service.resources`), the generated routes
and the OpenAPI document read only these two things, so a kind with special
rules is one module in this package that subclasses :class:`Behaviour` and
overrides the hooks it needs; nothing outside the package asks which kind it
is handling. The hooks, in the order a write calls them:

1. :meth:`Behaviour.validate`: pure checks and normalisation of the spec
   (no store), raising a 400 that names the field as the client wrote it;
2. :meth:`Behaviour.check_writable`: objects the kind never lets clients
   change (built-in roles);
3. :meth:`Behaviour.merge_update` (updates only): values the stored object
   keeps that the body cannot express (write-only secrets, synced fields);
4. :meth:`Behaviour.authorize`: permissions beyond the generic one;
5. :meth:`Behaviour.check_references`: references to other stored objects;
6. :meth:`Behaviour.after_write`: side effects in the same transaction, and
   fields only the response carries (a new key, the install template).

:meth:`Behaviour.before_delete` runs before a recursive delete and
:meth:`Behaviour.render` turns a stored object into its REST form.
:attr:`Behaviour.route_params` declares the extra query parameters of the
kind's routes; their values reach every hook as ``options``.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from sqlalchemy.engine import Connection

from meshplane import gateway_contract
from meshplane.config_error import ConfigError
from mgmt_api import fqn as fqnmod
from mgmt_api.access import Principal
from mgmt_api.domain import rbac
from mgmt_api.domain.times import rfc3339
from mgmt_api.schemas.base import ApiModel
from mgmt_api.store import repo
from mgmt_api.store.uow import Tx

COMMON_OUTPUT_ONLY = frozenset({"fqn", "etag", "createTime", "updateTime"})

#: Operations of the generated routes, for :class:`RouteParam`.
LIST, GET, CREATE = "list", "get", "create"


@dataclass(frozen=True)
class RouteParam:
    """A query parameter some of a kind's generated routes take (``fetchWorkloads``).

    ``annotation`` is the FastAPI parameter annotation (``Annotated[QueryBool,
    Query(alias=...)]``); the value reaches the hooks as ``options[name]``.
    """

    name: str
    annotation: Any
    default: Any
    operations: frozenset[str]

    def parameter(self) -> inspect.Parameter:
        return inspect.Parameter(
            self.name,
            inspect.Parameter.KEYWORD_ONLY,
            annotation=self.annotation,
            default=self.default,
        )


@dataclass(frozen=True)
class KindSettings:
    """Server settings some kinds' behaviour depends on (built once by the app).

    ``onboarding_tenant`` and ``onboarding_workspace`` name the tenant and
    workspace that cluster onboarding creates in each organization (settings
    ``MESHPLANE_ONBOARDING_TENANT``/``_WORKSPACE``); ``stale_after_seconds``
    is how long an agent may be silent before its cluster shows stale.
    ``grpc_public_url`` (``MESHPLANE_GRPC_PUBLIC_URL``), ``grpc_listen`` and
    ``grpc_tls`` say where gateways reach the gRPC port (:meth:`ads_url`).
    """

    onboarding_tenant: str = "onboarding"
    onboarding_workspace: str = "onboarding"
    stale_after_seconds: float = 300.0
    grpc_public_url: str | None = None
    grpc_listen: str | None = None  # HOST:PORT, None when the gRPC port is off
    grpc_tls: bool = False

    def __post_init__(self) -> None:
        """Refuse names that could never be FQN segments, and a gRPC URL no gateway
        could dial, at start-up.

        Otherwise the first onboarding write would fail with a 400 about a
        name no client sent, and every install template would carry a
        bootstrap Envoy refuses.
        """
        if self.grpc_public_url is not None:
            try:
                gateway_contract.grpc_address(self.grpc_public_url, "the gRPC public URL")
            except gateway_contract.NodeError as exc:
                raise ConfigError(str(exc), field="MESHPLANE_GRPC_PUBLIC_URL") from None
        for setting, value in (
            ("MESHPLANE_ONBOARDING_TENANT", self.onboarding_tenant),
            ("MESHPLANE_ONBOARDING_WORKSPACE", self.onboarding_workspace),
        ):
            if not fqnmod.is_name(value):
                raise ConfigError(
                    f"{value!r} is not a DNS-1123 label (lower-case letters, digits and '-', "
                    "starting and ending with a letter or digit, at most 63 characters)",
                    field=setting,
                )

    def ads_url(self, base_url: str) -> str | None:
        """The ``grpc://``/``grpcs://`` URL gateways reach mgmt-api's ADS (gRPC port) at.

        ``MESHPLANE_GRPC_PUBLIC_URL`` when set; otherwise the host of the
        public base URL (the address the client used, without
        ``MESHPLANE_PUBLIC_URL``) with the port of the gRPC listener, ``grpcs``
        when that port serves TLS. None when there is no gRPC port, or its
        port is only known once bound (``:0``) and no public URL says it.
        """
        if self.grpc_public_url is not None:
            return self.grpc_public_url
        if self.grpc_listen is None:
            return None
        port = self.grpc_listen.rpartition(":")[2]
        host = urlsplit(base_url).hostname
        if not port.isdigit() or int(port) == 0 or not host:
            return None
        host = f"[{host}]" if ":" in host else host
        return f"{'grpcs' if self.grpc_tls else 'grpc'}://{host}:{int(port)}"

    def onboarding_tenant_fqn(self, organization: str) -> str:
        return f"{organization}/tenants/{self.onboarding_tenant}"

    def onboarding_workspace_fqn(self, organization: str) -> str:
        return f"{self.onboarding_tenant_fqn(organization)}/workspaces/{self.onboarding_workspace}"


@dataclass(frozen=True)
class Write:
    """One write of one object, as the hooks see it.

    ``spec`` is what will be stored (hooks may normalise it in place);
    ``body`` is the request model as sent, for write-only fields that are
    never stored in the spec (a password).
    """

    fqn: str
    parent: str
    name: str
    prefix: str  # how the client names the object in the body: "cluster"
    spec: dict[str, Any]
    body: ApiModel
    creating: bool
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class WriteEnv:
    """What in-transaction hooks get: the transaction, the caller and the settings."""

    tx: Tx
    principal: Principal
    base_url: str  # the management plane's address, for install templates
    settings: KindSettings


@dataclass(frozen=True)
class RenderEnv:
    """What :meth:`Behaviour.render` gets besides the object."""

    conn: Connection
    settings: KindSettings
    now_us: int
    options: Mapping[str, Any] = field(default_factory=dict)


class Behaviour:
    """The default behaviour: a plain stored object. Subclasses override hooks."""

    route_params: tuple[RouteParam, ...] = ()

    def validate(self, write: Write) -> None:
        """Check and normalise ``write.spec`` (pure: no store)."""

    def check_writable(self, fqn: str, operation: str) -> None:
        """Refuse an ``operation`` ("create", "update", "delete") the kind never allows."""

    def merge_update(self, stored: repo.Resource, write: Write) -> None:
        """Carry stored values the update body cannot express into ``write.spec``."""

    def authorize(self, env: WriteEnv, write: Write) -> None:
        """Permissions the write needs beyond the generic CREATE/WRITE."""

    def check_references(self, env: WriteEnv, write: Write) -> None:
        """References from the spec to other stored objects."""

    def after_write(self, env: WriteEnv, write: Write, res: repo.Resource) -> dict[str, Any]:
        """Side effects in the write's transaction; returns fields only the response has."""
        return {}

    def audit_properties(self, write: Write) -> dict[str, Any]:
        """Extra properties of the write's audit record."""
        return {}

    def before_delete(self, env: WriteEnv, fqn: str) -> None:
        """Side effects of deleting ``fqn`` (and everything below it)."""

    def render(self, res: repo.Resource, env: RenderEnv) -> dict[str, Any]:
        """The REST form of a stored object."""
        return render_common(res)

    def read_writes(self, options: Mapping[str, Any]) -> bool:
        """Whether a GET with these options writes (and so runs in a write transaction)."""
        return False

    def on_read_write(
        self, env: WriteEnv, res: repo.Resource, options: Mapping[str, Any]
    ) -> dict[str, Any]:
        """The writing part of such a GET; returns fields added to the response."""
        return {}


def create_object(
    env: WriteEnv,
    kind: str,
    fqn: str,
    spec: dict[str, Any],
    *,
    protected: bool = False,
    creator_is_admin: bool = True,
) -> repo.Resource | None:
    """Insert a new object and its access policy; None when the FQN is taken.

    The caller gets ``rbac/admin`` on what it creates (``creator_is_admin``);
    objects the platform creates on a user's behalf (the onboarding tenant)
    get an empty policy instead and inherit their parent's.
    """
    res = repo.new_resource(
        fqn, kind, spec, revision=env.tx.revision, creator=env.tx.actor, protected=protected
    )
    if not repo.insert(env.tx.conn, res):
        return None
    bindings = [rbac.admin_binding(env.principal.subject_field, env.principal.fqn)]
    repo.insert_policy(
        env.tx.conn, fqn, bindings if creator_is_admin else [], env.tx.etag(fqn, "#policy")
    )
    return res


def render_common(res: repo.Resource) -> dict[str, Any]:
    """Spec plus the server-owned fields every kind shows."""
    out = dict(res.spec)
    out["fqn"] = res.fqn
    out["etag"] = res.etag
    out["createTime"] = rfc3339(res.create_time)
    out["updateTime"] = rfc3339(res.update_time)
    return out


@dataclass(frozen=True, slots=True)
class KindDef:
    """A kind's REST shape and where it lives in the FQN tree.

    ``parents`` are kinds (or ``fqn.ROOT_KIND`` / ``fqn.RBAC_KIND``);
    ``output_only`` fields may be sent back as they were read and are then
    ignored (never stored from client input).
    """

    kind: str
    collection: str  # path segment, e.g. "clusters"
    param: str  # path parameter name of this kind, e.g. "cluster"
    body_field: str  # create body wrapper, e.g. "cluster"
    list_field: str  # list response field, e.g. "clusters"
    model: type[ApiModel]
    parents: tuple[str, ...]
    behaviour: Behaviour = field(default_factory=Behaviour)
    protectable: bool = False
    output_only: frozenset[str] = COMMON_OUTPUT_ONLY
    #: The subject field an access-policy binding uses for principals of this kind.
    subject_field: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "output_only", self.output_only | COMMON_OUTPUT_ONLY)

    def params_for(self, operation: str) -> list[RouteParam]:
        return [p for p in self.behaviour.route_params if operation in p.operations]
