"""The demo's seeder on a re-run, against a real mgmt-api: a user's edit survives.

``scripts/run`` seeds on every start. A re-run creates what is missing and
leaves what exists as it is; an object someone changed after the seeder wrote
it is reported as kept (it differs from the plan) and keeps the change. Only an object the
seeder wrote and nobody touched since (its etag is the one the seeder left,
in the state directory's ledger) follows a moved plan, as when the demo's
ports move. Each test seeds its own organization on one shared server.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from demo.seed import CREATED, KEPT, LEFT, UPDATED, credential_files, demo_plan, seed
from demo.stack import seed_summary
from tests.mgmt_api.harness import MgmtServer

WORKSPACE = "tenants/demo/workspaces/demo"


@pytest.fixture(scope="module")
def admin() -> Iterator[httpx.Client]:
    server = MgmtServer().start()
    try:
        with server.admin() as client:
            yield client
    finally:
        server.close()


def setting_path(org: str, group: str) -> str:
    return f"/v2/organizations/{org}/{WORKSPACE}/securitygroups/{group}/settings/default"


def edit_uri(admin: httpx.Client, path: str, uri: str) -> None:
    """What a user does: read the setting, change its ext_authz server, write it back."""
    stored = admin.get(path).json()
    authorization = stored["authorization"]
    authorization["http"]["external"]["uri"] = uri
    answer = admin.put(path, json={"authorization": authorization, "etag": stored["etag"]})
    assert answer.status_code == 200, answer.text


def uri_of(admin: httpx.Client, path: str) -> str:
    return str(admin.get(path).json()["authorization"]["http"]["external"]["uri"])


def test_a_rerun_creates_nothing_and_keeps_a_users_edit(
    admin: httpx.Client, tmp_path: Path
) -> None:
    plan = demo_plan(organization="rerun", extauthz_uri="grpc://127.0.0.1:9191")
    keys, ledger = credential_files(tmp_path), tmp_path / "seeded.json"
    first = seed(admin, plan, keys, ledger)
    assert set(first.values()) == {CREATED}, first
    assert seed_summary(first) == [f"seeded: {len(plan.resources)} created, 0 left as they are"]

    edited = setting_path("rerun", "web")
    edit_uri(admin, edited, "grpc://127.0.0.1:19191")
    again = seed(admin, plan, keys, ledger)

    assert uri_of(admin, edited) == "grpc://127.0.0.1:19191"  # the edit stays
    assert again[edited] == KEPT
    assert Counter(again.values()) == {LEFT: len(plan.resources) - 1, KEPT: 1}
    assert seed_summary(again) == [
        f"seeded: 0 created, {len(plan.resources)} left as they are"
        " (1 differing from the demo's, kept)",
        f"  kept as it is: {edited}",
    ]


def test_a_moved_plan_moves_only_what_nobody_touched(admin: httpx.Client, tmp_path: Path) -> None:
    """The ports moved (a new extauthz URI): the seeder's untouched settings follow it,
    the one a user edited keeps the user's value."""
    keys, ledger = credential_files(tmp_path), tmp_path / "seeded.json"
    seed(admin, demo_plan(organization="moved", extauthz_uri="grpc://127.0.0.1:9191"), keys, ledger)
    users = setting_path("moved", "shop")
    edit_uri(admin, users, "grpc://127.0.0.1:29191")

    moved = demo_plan(organization="moved", extauthz_uri="grpc://127.0.0.1:39191")
    report = seed(admin, moved, keys, ledger)

    untouched = setting_path("moved", "web")
    assert report[untouched] == UPDATED and uri_of(admin, untouched) == "grpc://127.0.0.1:39191"
    assert report[users] == KEPT and uri_of(admin, users) == "grpc://127.0.0.1:29191"
    # Without a ledger (the compose seed step), nothing that exists is written.
    seed(admin, demo_plan(organization="moved", extauthz_uri="grpc://127.0.0.1:1"), keys)
    assert uri_of(admin, untouched) == "grpc://127.0.0.1:39191"
