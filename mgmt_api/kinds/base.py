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
   keeps that the body cannot express (synced fields; the markers of
   write-only key material, :attr:`Behaviour.secrets`, are put back by the
   generic update itself);
4. :meth:`Behaviour.authorize`: permissions beyond the generic one; before
   it, the generic path checks the kind's :attr:`Behaviour.grants` (fields
   whose change grants access need what a policy change needs);
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
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from sqlalchemy.engine import Connection

from meshplane import gateway_contract
from meshplane.config_error import ConfigError
from meshplane.kinds_contract import SHAPES, Kind, KindShape
from mgmt_api import access
from mgmt_api import fqn as fqnmod
from mgmt_api.access import Principal
from mgmt_api.compiler.key_material import SecretField
from mgmt_api.domain import rbac
from mgmt_api.domain.times import rfc3339
from mgmt_api.schemas.base import ApiModel
from mgmt_api.store import repo
from mgmt_api.store.uow import Tx

#: Operations of the generated routes, for :class:`RouteParam`.
LIST, GET, CREATE = "list", "get", "create"


#: The values of a kind's extra query parameters (its ``route_params``), by name,
#: as every hook gets them: each is a ``QueryBool`` or a string enumeration
#: (``keyEncoding``). The routes' dependency builds one (``routes.templated``).
QueryOptions = Mapping[str, bool | str]


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
    options: QueryOptions = field(default_factory=dict)


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
    options: QueryOptions = field(default_factory=dict)


def _the_object(conn: Connection, fqn: str, kind: str) -> list[tuple[str, str]]:
    return [(fqn, kind)]


@dataclass(frozen=True)
class AccessGrant:
    """A field or operation that grants access without touching a policy.

    Who belongs to a team, a user's credentials and the names a login maps
    to, a service account's keys, a role's rules: changing one changes what
    some principal may do as surely as editing a policy, so it needs what a
    policy change needs (``permission``, SET_POLICY), not just WRITE. A kind
    declares these in :attr:`Behaviour.grants`; this is the one list the
    checks, the permission table in docs/api.md and its tests all read.

    A row with a ``field`` (a path into the stored spec, ``("members",)`` or
    ``("labels", "identity.meshplane.io/oidc")``) is checked by the generic
    update whenever the value changes (lists compare as sets; a missing value
    equals an empty one); ``write_only`` fields (a password) are never stored
    in the spec, so sending one at all is the change. An ``on_create`` row is
    checked by the generic create before the object exists. Any other row is
    an operation (minting a key) that its own code checks with
    :meth:`require`. ``targets`` says where the permission is checked
    (default: the object itself); ``on`` says it in words. Field rows do not
    apply on create: the creator becomes ``rbac/admin`` of what it creates
    (:func:`create_object`), so it holds them anyway.
    """

    kind: str
    name: str  # as the table in docs/api.md names it
    why: str
    field: tuple[str, ...] | None = None
    write_only: bool = False
    on_create: bool = False
    permission: str = rbac.SET_POLICY
    on: str = "the object"
    targets: Callable[[Connection, str, str], list[tuple[str, str]]] = _the_object

    def require(self, conn: Connection, principal: Principal, fqn: str) -> None:
        """403 unless ``principal`` holds the permission everywhere this row says."""
        for target, kind in self.targets(conn, fqn, self.kind):
            access.require(conn, principal, target, kind, self.permission)

    def changed_by(self, write: Write, stored: Mapping[str, Any]) -> bool:
        """Whether ``write`` changes this row's field of the ``stored`` spec."""
        if self.field is None:
            return False
        if self.write_only:
            sent = write.body.model_dump(by_alias=True, exclude_none=True, mode="json")
            return _at(sent, self.field) is not None
        return bool(
            _comparable(_at(write.spec, self.field)) != _comparable(_at(stored, self.field))
        )


def naming(conn: Connection, fqn: str, kind: str) -> list[tuple[str, str]]:
    """Where ``fqn`` is already named: each policy with a binding of it and, for a
    user or service account, each team of its organization that lists it.

    Bindings and memberships outlive what they name (deleting a team or user
    leaves them), so creating the object again would revive them for its
    creator: that needs SET_POLICY wherever they are (:func:`revived_by_create`).
    """
    out = [(node, access.node_kind(node)) for node in repo.policies_naming(conn, fqn)]
    org = fqnmod.parse(fqn).organization
    if kind != "Team" and org is not None:
        for team, spec in repo.find_specs(conn, "Team", parents=[org], spec_contains=fqn):
            if fqn in (spec.get("members") or []):
                out.append((team, "Team"))
    return out


def revived_by_create(kind: str) -> AccessGrant:
    """The create row of a kind that policies (and teams) can name: see :func:`naming`."""
    teams = "" if kind == "Team" else " or team"
    return AccessGrant(
        kind,
        f"create while a policy{teams} names it",
        "the new object gets what those bindings" + (" and teams" if teams else "") + " grant",
        on_create=True,
        on="each object whose policy names it"
        + ("" if kind == "Team" else ", each team listing it"),
        targets=naming,
    )


def _at(obj: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(key)
    return obj


def _comparable(value: Any) -> Any:
    """A value as access sees it: order of a list and empty-versus-missing do not count."""
    if value in (None, "", [], {}):
        return None
    if isinstance(value, list):
        return frozenset(json.dumps(v, sort_keys=True) for v in value)
    return json.dumps(value, sort_keys=True)


def require_grants(
    env: WriteEnv, grants: tuple[AccessGrant, ...], write: Write, stored: Mapping[str, Any] | None
) -> None:
    """The generic write's check of the access-granting rows (:class:`AccessGrant`):
    the ``on_create`` rows on create (``stored`` None), changed fields on update."""
    for grant in grants:
        if grant.on_create if stored is None else grant.changed_by(write, stored):
            grant.require(env.tx.conn, env.principal, write.fqn)


class Behaviour:
    """The default behaviour: a plain stored object. Subclasses override hooks."""

    route_params: tuple[RouteParam, ...] = ()
    #: Fields and operations of the kind that grant access (:class:`AccessGrant`).
    grants: tuple[AccessGrant, ...] = ()
    #: Key-bearing fields: write-only, read back as a fingerprint marker. The
    #: generic CRUD redacts, restores and refuses markers for every kind alike
    #: (:mod:`mgmt_api.compiler.key_material`), so a kind only declares them.
    secrets: tuple[SecretField, ...] = ()

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

    def audit_properties(self, write: Write) -> dict[str, bool]:
        """Extra properties of the write's audit record (flags: what changed, never a value)."""
        return {}

    def before_delete(self, env: WriteEnv, fqn: str) -> None:
        """Side effects of deleting ``fqn`` (and everything below it)."""

    def render(self, res: repo.Resource, env: RenderEnv) -> dict[str, Any]:
        """The REST form of a stored object."""
        return render_common(res)

    def read_writes(self, options: QueryOptions) -> bool:
        """Whether a GET with these options writes (and so runs in a write transaction)."""
        return False

    def on_read_write(
        self, env: WriteEnv, res: repo.Resource, options: QueryOptions
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
    """A kind as the server implements it: its model, its behaviour, and its
    shape (where it lives in the FQN tree, how bodies name it), which is the
    contract's row (:data:`meshplane.kinds_contract.SHAPES`), never restated.

    ``output_only`` fields may be sent back as they were read and are then
    ignored (never stored from client input).
    """

    kind: Kind
    model: type[ApiModel]
    behaviour: Behaviour = field(default_factory=Behaviour)
    protectable: bool = False

    @property
    def shape(self) -> KindShape:
        return SHAPES[self.kind]

    @property
    def collection(self) -> str:
        """Path segment, e.g. ``clusters``."""
        return self.shape.collection

    @property
    def param(self) -> str:
        """Path parameter name of this kind, e.g. ``cluster``."""
        return self.shape.param

    @property
    def body_field(self) -> str:
        """Create body wrapper, e.g. ``cluster``."""
        return self.shape.body_field

    @property
    def list_field(self) -> str:
        """List response field, e.g. ``clusters``."""
        return self.shape.list_field

    @property
    def parents(self) -> tuple[Kind, ...]:
        """Kinds (or ``fqn.ROOT_KIND`` / ``fqn.RBAC_KIND``) objects of this kind live under."""
        return self.shape.parents

    @property
    def output_only(self) -> frozenset[str]:
        return self.shape.output_only

    @property
    def subject_field(self) -> str | None:
        """The subject field an access-policy binding uses for principals of this kind."""
        return self.shape.subject_field

    def params_for(self, operation: str) -> list[RouteParam]:
        return [p for p in self.behaviour.route_params if operation in p.operations]
