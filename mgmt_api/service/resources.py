"""Generic CRUD over every kind, with the per-kind behaviour it needs.

Each operation is one transaction: the permission check, the write, the
creator's policy, side objects (a cluster's service account and key) and the
audit record commit or roll back together. Writes start by bumping the
global revision, which also yields the new etag.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from mgmt_api import fqn as fqnmod
from mgmt_api.auth import keys as keymod
from mgmt_api.auth import passwords
from mgmt_api.compiler import key_material
from mgmt_api.domain import etags, inventory, listing, rbac
from mgmt_api.errors import ApiError, Code, already_exists, invalid, not_found
from mgmt_api.kinds import KINDS, KindDef
from mgmt_api.schemas.base import ApiModel
from mgmt_api.service import authz, onboarding_sync, profiles, validation
from mgmt_api.service.authz import Principal
from mgmt_api.store import repo
from mgmt_api.store.engine import read_tx, write_tx

log = logging.getLogger(__name__)

CLUSTER_AGENT_SA = "agent"
CLUSTER_AGENT_ROLE = "rbac/editor"
MAX_SCAN = 10_000


def rfc3339(us: int) -> str:
    return (
        dt.datetime.fromtimestamp(us / 1e6, tz=dt.UTC)
        .isoformat(timespec="microseconds")
        .replace("+00:00", "Z")
    )


@dataclass(frozen=True, slots=True)
class CallContext:
    principal: Principal
    base_url: str  # management-plane address agents should use


@dataclass(frozen=True, slots=True)
class ListResult:
    items: list[dict[str, Any]]
    next_page_token: str


def _spec_from(kdef: KindDef, body: ApiModel) -> dict[str, Any]:
    data = body.model_dump(by_alias=True, exclude_none=True, mode="json")
    return {k: v for k, v in data.items() if k not in kdef.output_only}


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


def key_view(
    key_id: str, jwk: dict[str, Any], encoding: str, private: keymod.KeyPair | None = None
) -> dict[str, Any]:
    if encoding == "JWK":
        public = json.dumps(jwk, separators=(",", ":"))
        secret = json.dumps(private.private_jwk, separators=(",", ":")) if private else None
    else:
        public = keymod.public_pem_of(jwk)
        secret = private.private_pem if private else None
    view: dict[str, Any] = {"id": key_id, "publicKey": public, "encoding": encoding}
    if secret is not None:
        view["privateKey"] = secret
    return view


class ResourceService:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        # Told the new store revision after every committed create, update or
        # delete; policy distribution uses it to push snapshots at once.
        self.on_commit: Callable[[int], None] | None = None
        # Settings of cluster onboarding and agent reports (set by the app).
        self.onboarding = onboarding_sync.OnboardingNames()
        self.stale_after_seconds = inventory.DEFAULT_STALE_AFTER_SECONDS

    def _committed(self, revision: int) -> None:
        if self.on_commit is not None:
            self.on_commit(revision)

    # ---- rendering -------------------------------------------------------

    def render(
        self,
        conn: Connection,
        res: repo.Resource,
        *,
        fetch_workloads: bool = False,
        key_encoding: str = "PEM",
    ) -> dict[str, Any]:
        out = dict(res.spec)
        out["fqn"] = res.fqn
        out["etag"] = res.etag
        out["createTime"] = rfc3339(res.create_time)
        out["updateTime"] = rfc3339(res.update_time)
        if res.kind == "Cluster":
            namespaces = res.status.get("namespaces") or []
            out["namespaces"] = namespaces if fetch_workloads else strip_workloads(namespaces)
            if res.status.get("state"):
                out["state"] = inventory.state_view(
                    res.status, repo.now_us(), self.stale_after_seconds
                )
        elif res.kind == "ServiceAccount":
            out["keys"] = [
                key_view(k, jwk, key_encoding) for k, jwk, _ in repo.keys_of(conn, res.fqn)
            ]
        elif res.kind == "ExtAuthzPolicy":
            out = key_material.redact(out)  # secrets are write-only (docs/api.md)
        return out

    # ---- helpers ---------------------------------------------------------

    @staticmethod
    def _require_parent(conn: Connection, parent: str) -> None:
        if parent not in (fqnmod.ROOT, fqnmod.RBAC) and not repo.exists(conn, parent):
            raise not_found(parent)

    @staticmethod
    def _audit(  # noqa: PLR0917 - a private helper; positional order is the sentence
        conn: Connection, ctx: CallContext, fqn: str, kind: str, op: str, msg: str, **props: Any
    ) -> None:
        repo.audit(
            conn,
            organization=repo.org_name(fqn),
            fqn=fqn,
            kind=kind,
            operation=op,
            actor=ctx.principal.fqn,
            message=msg,
            properties=props,
        )

    def _after_write(
        self, conn: Connection, ctx: CallContext, res: repo.Resource, revision: int, prefix: str
    ) -> None:
        """Side effects of kinds with their own (cluster onboarding), same transaction."""
        onboarding_sync.after_write(
            conn,
            res,
            actor=ctx.principal.fqn,
            names=self.onboarding,
            revision=revision,
            prefix=prefix,
        )

    # ---- create ----------------------------------------------------------

    def create(
        self,
        ctx: CallContext,
        kdef: KindDef,
        parent: str,
        name: str,
        body: ApiModel,
        *,
        key_encoding: str = "PEM",
    ) -> dict[str, Any]:
        fqnmod.validate_segment(kdef.collection, name, "name")
        fqn = fqnmod.child_fqn(parent, kdef.collection, name)
        prefix = kdef.body_field
        spec = validation.validate(
            kdef.kind, prefix, _spec_from(kdef, body), creating=True, name=name
        )
        password = getattr(body, "password", None)
        if password is not None:
            validation.validate_password(password, f"{prefix}.password")
        if kdef.kind == "Role" and fqn in rbac.BUILTIN_ROLES:
            raise already_exists(fqn)
        try:
            with write_tx(self.engine) as conn:
                revision = repo.bump_revision(conn)
                authz.require(conn, ctx.principal, parent, kdef.kind, rbac.CREATE)
                if kdef.kind == "Cluster":
                    authz.require(conn, ctx.principal, parent, "Organization", rbac.SET_POLICY)
                self._require_parent(conn, parent)
                profiles.check_references(conn, fqn, spec, prefix)
                res = self._insert(
                    conn,
                    ctx=ctx,
                    kind=kdef.kind,
                    fqn=fqn,
                    parent=parent,
                    name=name,
                    spec=spec,
                    revision=revision,
                )
                if password is not None:
                    repo.set_password_hash(conn, fqn, passwords.hash_password(password))
                self._after_write(conn, ctx, res, revision, prefix)
                out = self.render(conn, res, key_encoding=key_encoding)
                if kdef.kind == "ServiceAccount":
                    pair = self._new_key(conn, fqn)
                    out["keys"] = [key_view(pair.id, pair.public_jwk, key_encoding, pair)]
                elif kdef.kind == "Cluster":
                    sa_out, template = self._create_cluster_agent(conn, ctx, res, revision)
                    out["serviceAccount"] = sa_out
                    out["installTemplate"] = template
                self._audit(conn, ctx, fqn, kdef.kind, "CREATE", f"created {kdef.kind} {fqn}")
        except sa.exc.IntegrityError:
            raise already_exists(fqn) from None
        self._committed(revision)
        log.info("created", extra={"fqn": fqn, "kind": kdef.kind, "actor": ctx.principal.fqn})
        return out

    def _insert(
        self,
        conn: Connection,
        *,
        ctx: CallContext,
        kind: str,
        fqn: str,
        parent: str,
        name: str,
        spec: dict[str, Any],
        revision: int,
    ) -> repo.Resource:
        res = repo.new_resource(
            fqn,
            kind,
            spec,
            revision=revision,
            creator=ctx.principal.fqn,
            protected=bool(spec.get("deletionProtectionEnabled")),
            parent=parent,
            name=name,
        )
        if not repo.insert(conn, res):
            raise already_exists(fqn)
        binding = rbac.admin_binding(ctx.principal.subject_field, ctx.principal.fqn)
        repo.insert_policy(conn, fqn, [binding], etags.compute(fqn + "#policy", revision))
        return res

    @staticmethod
    def _new_key(conn: Connection, sa_fqn: str) -> keymod.KeyPair:
        pair = keymod.generate()
        repo.add_key(conn, pair.id, sa_fqn, pair.public_jwk)
        return pair

    def _create_cluster_agent(
        self, conn: Connection, ctx: CallContext, cluster: repo.Resource, revision: int
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """The cluster's service account, its first key and the install template."""
        sa_fqn = fqnmod.child_fqn(cluster.fqn, "serviceaccounts", CLUSTER_AGENT_SA)
        spec = {"displayName": f"Agent of {cluster.name}", "description": "Cluster service account"}
        sa_res = self._insert(
            conn,
            ctx=ctx,
            kind="ServiceAccount",
            fqn=sa_fqn,
            parent=cluster.fqn,
            name=CLUSTER_AGENT_SA,
            spec=spec,
            revision=revision,
        )
        # The agent manages its cluster: add it to the cluster's policy.
        policy = repo.get_policies(conn, [cluster.fqn])[cluster.fqn]
        allow = [
            *policy.allow,
            {"role": CLUSTER_AGENT_ROLE, "subjects": [{"serviceAccount": sa_fqn}]},
        ]
        repo.update_policy_if_etag(
            conn,
            cluster.fqn,
            old_etag=policy.etag,
            allow=allow,
            description=policy.description,
            etag=etags.compute(cluster.fqn + "#policy!", revision),
        )
        pair = self._new_key(conn, sa_fqn)
        sa_out = self.render(conn, sa_res)
        sa_out["keys"] = [key_view(pair.id, pair.public_jwk, "PEM", pair)]
        return sa_out, self.install_template(ctx, cluster, sa_fqn, pair)

    @staticmethod
    def install_template(
        ctx: CallContext, cluster: repo.Resource, sa_fqn: str, pair: keymod.KeyPair
    ) -> dict[str, Any]:
        """Minimal values to install the cluster's agent; carries the API key, never stored."""
        url = urlsplit(ctx.base_url)
        port = url.port or (443 if url.scheme == "https" else 80)
        return {
            "message": (
                "Install the meshplane cluster agent with these values. The API key (secrets."
                "clusterServiceAccount) is shown only now; "
                "fetching the template again mints a new key."
            ),
            "helm": {
                "operator": {"deletionProtection": "disabled", "controlPlaneMode": "CONTROL"},
                "secrets": {
                    "clusterServiceAccount": {
                        "clusterFqn": cluster.fqn,
                        "serviceAccountFqn": sa_fqn,
                        "keyId": pair.id,
                        "jwk": json.dumps(pair.private_jwk, separators=(",", ":")),
                        "encodedJwk": keymod.encode_jwk(pair.private_jwk),
                    }
                },
                "spec": {
                    "managementPlane": {
                        "url": ctx.base_url.rstrip("/"),
                        "host": url.hostname or "",
                        "port": port,
                        "clusterName": cluster.name,
                        "selfSigned": url.scheme == "https",
                    },
                    "tier1Cluster": bool(cluster.spec.get("tier1Cluster")),
                    "tokenTtl": cluster.spec.get("tokenTtl", validation.DEFAULT_TOKEN_TTL),
                },
            },
        }

    # ---- read ------------------------------------------------------------

    def get(
        self,
        ctx: CallContext,
        fqn: str,
        *,
        fetch_workloads: bool = False,
        key_encoding: str = "PEM",
    ) -> dict[str, Any]:
        parsed = fqnmod.parse(fqn)
        with read_tx(self.engine) as conn:
            authz.require(conn, ctx.principal, fqn, parsed.kind, rbac.READ)
            res = repo.get(conn, fqn)
            if res is None:
                raise not_found(fqn)
            return self.render(
                conn, res, fetch_workloads=fetch_workloads, key_encoding=key_encoding
            )

    def get_cluster_with_template(
        self, ctx: CallContext, fqn: str, *, fetch_workloads: bool
    ) -> dict[str, Any]:
        """GET with includeInstallTemplate: mints a new agent key (a write, audited)."""
        parsed = fqnmod.parse(fqn)
        with write_tx(self.engine) as conn:
            repo.bump_revision(conn)
            authz.require(conn, ctx.principal, fqn, "Cluster", rbac.READ)
            authz.require(conn, ctx.principal, parsed.parent, "Organization", rbac.SET_POLICY)
            res = repo.get(conn, fqn)
            if res is None:
                raise not_found(fqn)
            sa_fqn = fqnmod.child_fqn(fqn, "serviceaccounts", CLUSTER_AGENT_SA)
            if not repo.exists(conn, sa_fqn):
                raise ApiError(
                    Code.FAILED_PRECONDITION, f"{sa_fqn} was deleted; recreate the cluster"
                )
            pair = self._new_key(conn, sa_fqn)
            out = self.render(conn, res, fetch_workloads=fetch_workloads)
            out["installTemplate"] = self.install_template(ctx, res, sa_fqn, pair)
            self._audit(
                conn,
                ctx,
                sa_fqn,
                "ServiceAccount",
                "GENERATE_KEY",
                f"install template requested for {fqn}",
                keyId=pair.id,
            )
            return out

    def list_objects(
        self,
        ctx: CallContext,
        kdef: KindDef,
        parent: str,
        *,
        page_size: int,
        page_token: str,
        label_selector: str,
        fetch_workloads: bool = False,
        name_contains: str = "",
    ) -> ListResult:
        after = listing.decode_token(page_token)
        if after and not after.startswith(parent + "/" if parent else ""):
            raise invalid("pageToken", "belongs to another collection")
        selector = listing.parse_selector(label_selector)
        items: list[dict[str, Any]] = []
        scanned = 0
        next_token = ""
        with read_tx(self.engine) as conn:
            self._require_parent(conn, parent)
            chunk = max(page_size, 100)
            while True:
                batch = repo.list_children(
                    conn, parent, kdef.kind, after, chunk, name_contains=name_contains
                )
                allowed = authz.readable(
                    conn, ctx.principal, parent, [r.fqn for r in batch], kdef.kind
                )
                for i, res in enumerate(batch):
                    after = res.fqn
                    scanned += 1
                    if res.fqn in allowed and listing.matches(res.spec.get("labels"), selector):
                        items.append(self.render(conn, res, fetch_workloads=fetch_workloads))
                        if len(items) == page_size:
                            if i + 1 < len(batch) or len(batch) == chunk:
                                next_token = listing.encode_token(after)
                            return ListResult(items, next_token)
                if len(batch) < chunk:
                    return ListResult(items, "")
                if scanned >= MAX_SCAN:  # bound the work of a sparse filtered page
                    return ListResult(items, listing.encode_token(after))

    # ---- update ----------------------------------------------------------

    def update(self, ctx: CallContext, fqn: str, body: ApiModel) -> dict[str, Any]:
        parsed = fqnmod.parse(fqn)
        kdef = KINDS[parsed.kind]
        etag = getattr(body, "etag", None)
        if not etag:
            raise invalid("etag", "is required on update; GET the object and send its etag")
        spec = _spec_from(kdef, body)
        if kdef.kind == "ExtAuthzPolicy":
            # Markers from a GET stand for the stored secrets (key_material).
            with read_tx(self.engine) as conn:
                stored = repo.get(conn, fqn)
            kept = stored.spec if stored is not None else None
            spec = validation.restore_secrets(kdef.body_field, spec, kept)
        spec = validation.validate(
            kdef.kind, kdef.body_field, spec, creating=False, name=parsed.name
        )
        password = getattr(body, "password", None)
        if password is not None:
            validation.validate_password(password, "password")
        if kdef.kind == "Role" and fqn in rbac.BUILTIN_ROLES:
            raise ApiError(
                Code.FAILED_PRECONDITION, f"{fqn} is a built-in role and cannot be changed"
            )
        with write_tx(self.engine) as conn:
            revision = repo.bump_revision(conn)
            authz.require(conn, ctx.principal, fqn, kdef.kind, rbac.WRITE)
            profiles.check_references(conn, fqn, spec, kdef.body_field)
            if password is not None:
                authz.require(conn, ctx.principal, fqn, kdef.kind, rbac.SET_POLICY)
            res = repo.get(conn, fqn)
            if res is None:
                raise not_found(fqn)
            if kdef.kind == "User" and res.spec.get("sourceType") not in (None, "MANUAL", "LOCAL"):
                spec["sourceType"] = res.spec["sourceType"]
            new_etag = etags.compute(fqn, revision)
            now = repo.now_us()
            if not repo.update_if_etag(
                conn,
                fqn,
                etag,
                spec=spec,
                protected=bool(spec.get("deletionProtectionEnabled")),
                etag=new_etag,
                update_time=now,
            ):
                raise ApiError(
                    Code.ABORTED,
                    f"{fqn} changed since etag {etag} was read; GET it again and retry",
                    metadata={"fqn": fqn, "etag": res.etag},
                )
            if password is not None:
                repo.set_password_hash(conn, fqn, passwords.hash_password(password))
            self._audit(
                conn,
                ctx,
                fqn,
                kdef.kind,
                "UPDATE",
                f"updated {kdef.kind} {fqn}",
                passwordChanged=password is not None,
            )
            res.spec, res.etag, res.update_time = spec, new_etag, now
            res.protected = bool(spec.get("deletionProtectionEnabled"))
            self._after_write(conn, ctx, res, revision, kdef.body_field)
            out = self.render(conn, res)
        self._committed(revision)
        return out

    # ---- delete ----------------------------------------------------------

    def delete(self, ctx: CallContext, fqn: str, *, force: bool) -> None:
        parsed = fqnmod.parse(fqn)
        if parsed.kind == "Role" and fqn in rbac.BUILTIN_ROLES:
            raise ApiError(
                Code.FAILED_PRECONDITION, f"{fqn} is a built-in role and cannot be deleted"
            )
        with write_tx(self.engine) as conn:
            revision = repo.bump_revision(conn)
            authz.require(conn, ctx.principal, fqn, parsed.kind, rbac.DELETE)
            if not repo.exists(conn, fqn):
                raise not_found(fqn)
            if not force:
                protected = repo.first_protected(conn, fqn)
                if protected is not None:
                    raise ApiError(
                        Code.FAILED_PRECONDITION,
                        f"{protected} has deletionProtectionEnabled; "
                        "clear it first or delete with force=true",
                        metadata={"protectedFqn": protected, "fqn": fqn},
                    )
            onboarding_sync.before_delete(
                conn, fqn, actor=ctx.principal.fqn, names=self.onboarding, revision=revision
            )
            count = repo.delete_subtree(conn, fqn)
            self._audit(
                conn,
                ctx,
                fqn,
                parsed.kind,
                "DELETE",
                f"deleted {parsed.kind} {fqn} and {count - 1} children",
                deleted=count,
                force=force,
            )
        self._committed(revision)
        log.info("deleted", extra={"fqn": fqn, "count": count, "actor": ctx.principal.fqn})

    # ---- service-account keys -------------------------------------------

    def generate_key(self, ctx: CallContext, sa_fqn: str, encoding: str) -> dict[str, Any]:
        with write_tx(self.engine) as conn:
            repo.bump_revision(conn)
            authz.require(conn, ctx.principal, sa_fqn, "ServiceAccount", rbac.SET_POLICY)
            if not repo.exists(conn, sa_fqn):
                raise not_found(sa_fqn)
            pair = self._new_key(conn, sa_fqn)
            self._audit(
                conn,
                ctx,
                sa_fqn,
                "ServiceAccount",
                "GENERATE_KEY",
                f"new key {pair.id}",
                keyId=pair.id,
            )
            return key_view(pair.id, pair.public_jwk, encoding, pair)

    def delete_key(self, ctx: CallContext, sa_fqn: str, key_id: str) -> None:
        with write_tx(self.engine) as conn:
            repo.bump_revision(conn)
            authz.require(conn, ctx.principal, sa_fqn, "ServiceAccount", rbac.WRITE)
            if not repo.delete_key(conn, sa_fqn, key_id):
                raise not_found(f"{sa_fqn}/keys/{key_id}")
            self._audit(
                conn,
                ctx,
                sa_fqn,
                "ServiceAccount",
                "DELETE_KEY",
                f"revoked key {key_id}",
                keyId=key_id,
            )

    def jwks(self, ctx: CallContext, sa_fqn: str) -> list[dict[str, Any]]:
        with read_tx(self.engine) as conn:
            authz.require(conn, ctx.principal, sa_fqn, "ServiceAccount", rbac.READ)
            if not repo.exists(conn, sa_fqn):
                raise not_found(sa_fqn)
            return [jwk for _, jwk, _ in repo.keys_of(conn, sa_fqn)]

    # ---- cluster config --------------------------------------------------

    def cluster_config(self, ctx: CallContext, fqn: str) -> dict[str, Any]:
        parsed = fqnmod.parse(fqn)
        with read_tx(self.engine) as conn:
            authz.require(conn, ctx.principal, fqn, "Cluster", rbac.READ)
            res = repo.get(conn, fqn)
            if res is None:
                raise not_found(fqn)
            org = repo.get(conn, parsed.parent)
            spec = res.spec
            out: dict[str, Any] = {
                "cluster": fqn,
                "tier1Cluster": bool(spec.get("tier1Cluster")),
                "tokenTtl": spec.get("tokenTtl", validation.DEFAULT_TOKEN_TTL),
                "systemNamespaces": (org.spec.get("systemNamespaces") if org else None) or [],
                "revision": repo.current_revision(conn),
            }
            for key in (
                "network",
                "trustDomain",
                "namespaceScope",
                "configGenerationMetadata",
                "rateLimit",
            ):
                if key in spec:
                    out[key] = spec[key]
            return out
