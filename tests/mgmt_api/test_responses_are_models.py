"""Responses are the kinds' models, and say exactly what the kinds render.

The resources service builds each response as its kind's model from the dict
the kind renders (:meth:`mgmt_api.service.resources.ResourceService.render`),
and the routes serialise the model (``templated.model_response``). For every
kind, on a real store: the JSON of a create, get, list and update is the
rendered object, value for value and type for type (no default the model adds,
no int read back as a float, no null dropped), plus the create's response-only
fields. In process, without a server: the routes' serialisation is one call.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from mgmt_api import fqn as fqnmod
from mgmt_api.access import CallContext, Principal
from mgmt_api.compiler.key_material import redact
from mgmt_api.errors import ApiError, Code
from mgmt_api.kinds import KINDS, KindDef, item_templates
from mgmt_api.kinds.base import RenderEnv
from mgmt_api.routes.templated import model_response
from mgmt_api.schemas.base import ApiModel, with_required_etag
from mgmt_api.service.bootstrap import ADMIN_FQN
from mgmt_api.service.container import Services
from mgmt_api.service.resources import ResourceService
from mgmt_api.settings import Settings
from mgmt_api.store import repo
from mgmt_api.store.engine import create_engine, migrate
from tests.mgmt_api.test_rbac_generated import CREATE_SPEC

#: What the kinds' write hooks add to a create's response (``Behaviour.after_write``):
#: a service account's first key with its private half, a cluster's agent and template.
RESPONSE_ONLY = {"keys", "serviceAccount", "installTemplate"}
ADMIN = CallContext(Principal(ADMIN_FQN, "user", frozenset({ADMIN_FQN})), "https://mgmt.test")


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ResourceService]:
    url = f"sqlite+pysqlite:///{tmp_path_factory.mktemp('store') / 'mgmt-api.db'}"
    engine = create_engine(url)
    migrate(engine)
    try:
        yield Services.build(engine, Settings(database_url=url, admin_password="x" * 16)).resources
    finally:
        engine.dispose()


def _typed(value: Any) -> Any:
    """``value`` with each scalar tagged by its JSON type, so 1 and 1.0 differ."""
    if isinstance(value, dict):
        return {k: _typed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_typed(v) for v in value]
    return (type(value).__name__, value)


def _wire(model: ApiModel) -> Any:
    return json.loads(bytes(model_response(model).body))


def _without_response_only(obj: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k not in RESPONSE_ONLY}


def _rendered(service: ResourceService, fqn: str) -> Any:
    """What the kind renders for the stored object, as JSON (its own dict, no model),
    with its key material as markers (the service redacts every kind's declared
    ``secrets`` alike)."""
    with service.uow.read() as conn:
        res = repo.get(conn, fqn)
        assert res is not None
        env = RenderEnv(conn, service.settings, repo.now_us(), {})
        behaviour = KINDS[res.kind].behaviour
        return json.loads(json.dumps(redact(behaviour.render(res, env), behaviour.secrets)))


def _ensure(service: ResourceService, fqn: str) -> ApiModel | None:
    """Create ``fqn`` (and its missing ancestors) as the API would; its create response."""
    if fqn in (fqnmod.ROOT, fqnmod.RBAC):
        return None
    with service.uow.read() as conn:
        if repo.exists(conn, fqn):
            return None
    parsed = fqnmod.parse(fqn)
    _ensure(service, parsed.parent)
    kdef = KINDS[parsed.kind]
    body = kdef.model.model_validate(CREATE_SPEC.get(parsed.kind, {}))
    return service.create(ADMIN, kdef, parsed.parent, parsed.name, body)


def _fqn(kdef: KindDef) -> str:
    """A new object of the kind at its first path: ancestors named ``x`` (shared by
    the kinds' tests, created once), the object itself ``leaf``."""
    namespaced = {k.param for k in KINDS.values() if k.collection in fqnmod.NAMESPACED}
    names = {k.param: "default.x" if k.param in namespaced else "x" for k in KINDS.values()}
    names[kdef.param] = "default.leaf" if kdef.param in namespaced else "leaf"
    return item_templates(kdef.kind)[0].format_map(names)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_create_get_list_update_say_what_the_kind_renders(
    service: ResourceService, kind: str
) -> None:
    kdef = KINDS[kind]
    fqn = _fqn(kdef)
    created = _ensure(service, fqn)
    assert created is not None, f"{fqn} existed before its test"
    rendered = _rendered(service, fqn)
    sent = _wire(created)
    assert _typed(_without_response_only(sent)) == _typed(_without_response_only(rendered))

    got = _wire(service.get(ADMIN, fqn))
    assert _typed(got) == _typed(rendered)

    parsed = fqnmod.parse(fqn)
    page = service.list_objects(
        ADMIN, kdef, parsed.parent, page_size=1000, page_token="", label_selector=""
    )
    listed = [_wire(item) for item in page.items]
    assert _typed(rendered) in [_typed(item) for item in listed]

    update_model = with_required_etag(kdef.model, f"Update{kind}Request")
    updated = _wire(service.update(ADMIN, fqn, update_model.model_validate(got)))
    assert updated["etag"] != got["etag"]
    assert _typed(updated) == _typed(_rendered(service, fqn))


def test_a_stored_object_its_model_refuses_is_a_500_naming_it_not_its_values(
    service: ResourceService, caplog: pytest.LogCaptureFixture
) -> None:
    """Written around the API (no ``namespaceSelector``, which a Workspace needs):
    reading it names the object and the field, and neither the answer nor the log
    quotes a stored value (pydantic's own message would)."""
    parent = _fqn(KINDS["Workspace"]).rpartition("/workspaces/")[0]
    _ensure(service, parent)
    fqn = f"{parent}/workspaces/written-around"
    with service.uow.write(ADMIN_FQN) as tx:
        spec = {"displayName": "do-not-quote-me"}
        res = repo.new_resource(fqn, "Workspace", spec, revision=tx.revision, creator=tx.actor)
        assert repo.insert(tx.conn, res)
    with pytest.raises(ApiError) as raised:
        service.get(ADMIN, fqn)
    assert raised.value.code == Code.INTERNAL
    assert raised.value.message == (
        f"stored Workspace {fqn} does not match its schema (fields: namespaceSelector)"
    )
    logged = [r for r in caplog.records if r.getMessage().startswith("stored object")]
    assert [getattr(r, "fields", None) for r in logged] == [["namespaceSelector"]]
    assert not any("do-not-quote-me" in str(vars(r)) for r in caplog.records)
