"""The pure approvals state machine: transitions never mutate, refusals change nothing."""

from __future__ import annotations

import pytest

from mgmt_api.domain import approvals as ap

A, B = "apps/a", "apps/b"


def test_transitions_return_new_policies_and_leave_the_old_one_alone() -> None:
    start = ap.set_policy(None, ap.Mode.REQUIRE_APPROVAL)
    requested = ap.add_request(start, ap.access(A, ["GET", "GET", "POST"]))
    approved = ap.approve_request(requested, ap.access(A, ["GET"]))
    assert start == ap.Policy(ap.Mode.REQUIRE_APPROVAL)
    assert requested.requested == (ap.Access(A, ("GET", "POST")),)
    assert (approved.requested, approved.approved) == ((), (ap.Access(A, ("GET",)),))


def test_approving_merges_into_an_existing_approval() -> None:
    policy = ap.add_approved(ap.Policy(ap.Mode.REQUIRE_APPROVAL), ap.access(A, ["GET"]))
    policy = ap.add_request(policy, ap.access(A, ["POST"]))
    policy = ap.approve_request(policy, ap.access(A, ["POST"]))
    assert policy.approved == (ap.Access(A, ("GET", "POST")),)


@pytest.mark.parametrize(
    ("step", "message"),
    [
        (lambda p: ap.delete_request(p, A), "use approved:delete"),
        (lambda p: ap.delete_request(p, B), "no pending access request"),
        (lambda p: ap.approve_request(p, ap.access(B, ["GET"])), "no pending access request"),
        (lambda p: ap.delete_approved(p, B), "no approved access"),
    ],
)
def test_refusals_are_not_found(step: object, message: str) -> None:
    policy = ap.add_approved(ap.Policy(ap.Mode.ALLOW_REQUESTED), ap.access(A, ["GET"]))
    with pytest.raises(ap.ApprovalError) as raised:
        step(policy)  # type: ignore[operator]
    assert raised.value.reason == "NOT_FOUND"
    assert message in raised.value.message


@pytest.mark.parametrize(
    ("mode", "requested", "approved", "expected"),
    [
        (ap.Mode.UNRESTRICTED, [], [], True),
        (ap.Mode.ALLOW_REQUESTED, ["GET"], [], True),
        (ap.Mode.ALLOW_REQUESTED, ["POST"], [], False),
        (ap.Mode.ALLOW_REQUESTED, [], ["GET"], True),
        (ap.Mode.REQUIRE_APPROVAL, ["GET"], [], False),
        (ap.Mode.REQUIRE_APPROVAL, [], ["GET"], True),
        (ap.Mode.REQUIRE_APPROVAL, [], [], False),
    ],
)
def test_check_answers_from_the_mode_and_the_lists(
    mode: ap.Mode, requested: list[str], approved: list[str], expected: bool
) -> None:
    policy = ap.Policy(
        mode,
        (ap.access(A, requested),) if requested else (),
        (ap.access(A, approved),) if approved else (),
    )
    assert ap.check(policy, A, "GET").allowed is expected


def test_json_round_trip() -> None:
    policy = ap.Policy(
        ap.Mode.ALLOW_REQUESTED,
        (ap.access(A, ["GET"]),),
        (ap.access(B, ["POST"]),),
        {"details": {"name": "n"}},
    )
    assert ap.Policy.from_json(policy.to_json()) == policy
