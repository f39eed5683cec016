"""meshctl's view of the kinds must match the server's registry.

meshctl never imports ``mgmt_api`` (it is a client of the public API and
may ship alone); both read ``meshplane/kinds_contract.py``. This test may
import both, and checks what each derives from that table (paths, fields,
parent chains as meshctl computes them from the server's parents), so a
derivation that goes wrong on either side fails here.
"""

from __future__ import annotations

from meshctl.kinds import KINDS as CLIENT_KINDS
from meshctl.kinds import lookup_kind, parse_fqn
from mgmt_api import fqn as fqnmod
from mgmt_api.kinds import KINDS as SERVER_KINDS

# Bookkeeping every object carries (meshctl keeps them in ``metadata``).
COMMON = frozenset({"fqn", "etag", "createTime", "updateTime"})
# Write-only inputs the server never returns, so they are no ``status`` field.
WRITE_ONLY = frozenset({"password"})


def server_chains(kind: str) -> set[tuple[str, ...]]:
    """Every chain of parent kinds, outermost first, under which ``kind`` lives."""
    chains: set[tuple[str, ...]] = set()
    for parent in SERVER_KINDS[kind].parents:
        if parent in (fqnmod.ROOT_KIND, fqnmod.RBAC_KIND):
            chains.add(())
        else:
            chains |= {(*chain, parent) for chain in server_chains(parent)}
    return chains


def test_meshctl_knows_exactly_the_server_kinds() -> None:
    assert set(CLIENT_KINDS) == set(SERVER_KINDS)


def test_each_kind_has_the_server_paths_fields_and_parents() -> None:
    for name, server in SERVER_KINDS.items():
        client = CLIENT_KINDS[name]
        assert (client.collection, client.body_field, client.list_field) == (
            server.collection,
            server.body_field,
            server.list_field,
        ), name
        assert set(client.chains) == server_chains(name), name
        assert client.status_fields == server.output_only - COMMON - WRITE_ONLY, name


def test_the_new_kinds_resolve_from_words_and_fqns() -> None:
    assert lookup_kind("profiles") is CLIENT_KINDS["Profile"]
    assert lookup_kind("onboarding") is CLIENT_KINDS["ClusterOnboardingConfig"]
    ref = parse_fqn("organizations/o/tenants/t/profiles/p")
    assert (ref.kind.name, ref.path) == ("Profile", "/v2/organizations/o/tenants/t/profiles/p")
    ref = parse_fqn("organizations/o/clusters/c/onboarding/main")
    assert ref.kind.name == "ClusterOnboardingConfig"
    assert ref.collection_path == "/v2/organizations/o/clusters/c/onboarding"
