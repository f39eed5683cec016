"""Table tests of ``meshctl status``'s pure parts: instance states, the exit verdict, the table."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from meshctl import status
from meshctl.errors import MeshctlError

NOW = datetime(2026, 11, 26, 17, 0, 30, tzinfo=UTC)


def instance(**kw: Any) -> dict[str, Any]:
    base = {
        "kind": "gateway",
        "instance": "gw-1",
        "connected": True,
        "stale": False,
        "appliedVersion": "a" * 20,
        "lastResult": "ACK",
        "lastError": "",
        "upToDate": True,
        "lastContactTime": "2026-11-26T17:00:00.000000Z",
    }
    return {**base, **kw}


def cluster(*instances: dict[str, Any], **body: Any) -> status.ClusterStatus:
    desired = {"gateway": "a" * 20, "ratelimit": "r" * 20}
    return status.ClusterStatus("o/c", {"desiredVersions": desired, "instances": instances, **body})


@pytest.mark.parametrize(
    ("fields", "state", "fails"),
    [
        ({}, "ACK", False),
        ({"upToDate": False, "appliedVersion": "old"}, "APPLYING", False),
        ({"upToDate": False, "lastResult": "NACK", "lastError": "refused"}, "NACK", True),
        # An older NACK since superseded by an ACK of the wanted version is fine.
        ({"lastResult": "NACK", "upToDate": True}, "ACK", False),
        ({"stale": True}, "STALE", True),
        ({"stale": True, "connected": False}, "STALE", True),
        ({"connected": False}, "DISCONNECTED", True),
    ],
)
def test_instance_states_and_the_exit_verdict(
    fields: dict[str, Any], state: str, fails: bool
) -> None:
    one = instance(**fields)
    assert status.instance_state(one) == state
    assert status.failing([cluster(one)], status.INSTANCE_KINDS) is fails


def test_kinds_narrow_what_is_judged_and_compile_errors_always_fail() -> None:
    nack = instance(upToDate=False, lastResult="NACK")
    healthy = instance(kind="ratelimit", instance="rl-1")
    assert status.failing([cluster(nack, healthy)], ("ratelimit",)) is False
    assert status.failing([cluster(nack, healthy)], ("gateway",)) is True
    broken = cluster(healthy, compileErrors={"extauthz": "bad key"})
    assert status.failing([broken], ("ratelimit",)) is True
    assert status.failing([cluster()], status.INSTANCE_KINDS) is False


def test_the_table_shows_versions_the_error_and_the_contact_age() -> None:
    nack = instance(
        upToDate=False, lastResult="NACK", appliedVersion="o" * 20, lastError="no\nfilter"
    )
    text = status.render_table(
        [cluster(nack, compileErrors={"extauthz": "bad key"})], status.INSTANCE_KINDS, NOW
    )
    header, row, note = text.splitlines()
    assert header.split()[:4] == ["CLUSTER", "KIND", "INSTANCE", "STATE"]
    assert row.split() == [
        "o/c",
        "gateway",
        "gw-1",
        "NACK",
        "o" * 12,
        "a" * 12,
        "30s",
        "ago",
        "no",
        "filter",
    ]
    assert note == "o/c: the extauthz snapshot does not compile: bad key"
    # The error of an instance that has since ACKed is not shown.
    acked = status.render_table([cluster(instance(lastError="old"))], ("gateway",), NOW)
    assert "old" not in acked
    assert status.render_table([cluster()], ("gateway",), NOW) == "No instance has subscribed.\n"


def test_unknown_kinds_and_bad_cluster_names_are_usage_errors() -> None:
    assert status.check_kinds([]) == status.INSTANCE_KINDS
    assert status.check_kinds(["ratelimit"]) == ("ratelimit",)
    with pytest.raises(MeshctlError, match="--kind must be one of"):
        status.check_kinds(["sidecars"])


def test_policy_errors_are_shown_and_do_not_fail_the_exit_code() -> None:
    message = "p selects on JWT claims (sub) for httproute/default/open, which ..."
    errors = [{"policy": "p", "route": "httproute/default/open", "message": message}]
    body = cluster(instance(), policyErrors=errors)
    text = status.render_table([body], status.INSTANCE_KINDS, NOW)
    assert text.splitlines()[-1] == f"o/c: not enforced as written: {message}"
    assert status.failing([body], status.INSTANCE_KINDS) is False


def test_warnings_are_shown_and_do_not_fail_the_exit_code() -> None:
    """A reference to a missing object is printed, never a failing exit."""
    message = "BackendTrafficPolicy p targets HTTPRoute default/ghost, which does not exist ..."
    body = cluster(instance(), warnings=[{"object": "p", "message": message}])
    text = status.render_table([body], status.INSTANCE_KINDS, NOW)
    assert text.splitlines()[-1] == f"o/c: warning: {message}"
    assert status.failing([body], status.INSTANCE_KINDS) is False
