"""``meshctl approvals``: wired to the approvals paths for organizations and clusters.

The approvals endpoints arrive in a later issue. These tests check what
exists today: the method, the exact path and the body meshctl sends (seen
through ``--verbose``, which logs request lines, never headers), and that the
exit code follows the status the real server answered (today 404 -> 4; once
the endpoints exist, 200 -> 0).
"""

from __future__ import annotations

import re

import pytest

from tests.meshctl.conftest import Meshctl, unique

EXIT_FOR_STATUS = {200: 0, 400: 1, 401: 3, 403: 3, 404: 4, 405: 1, 409: 5, 501: 1}


@pytest.fixture(scope="module")
def org(shared_admin: Meshctl) -> str:
    name = unique("appr")
    shared_admin.ok(
        "apply", "-f", "-",
        input=f"kind: Organization\nmetadata: {{name: {name}}}\n---\nkind: Cluster\n"
        f"metadata: {{name: c1, organization: {name}}}\n",
    )  # fmt: skip
    return name


CASES = [
    (["get"], "GET", ""),
    (["set-policy", "--mode", "REQUIRE_APPROVAL"], "POST", ""),
    (["delete-policy", "--force"], "DELETE", "?force=true"),
    (["request", "--subject", "organizations/O/users/u", "--permission", "GET"], "POST",
     "/requested:add"),
    (["approve", "--subject", "organizations/O/users/u", "--permission", "GET"], "POST",
     "/requested:approve"),
    (["delete-request", "--subject", "organizations/O/users/u"], "POST", "/requested:delete"),
    (["add-approved", "--subject", "organizations/O/users/u", "--permission", "POST"], "POST",
     "/approved:add"),
    (["delete-approved", "--subject", "organizations/O/users/u"], "POST", "/approved:delete"),
    (["query", "--type", "Cluster"], "POST", "/query"),
]  # fmt: skip


# Every operation on an organization; the cluster prefix for a GET and a POST.
MATRIX = [(*case, False) for case in CASES] + [(*CASES[i], True) for i in (0, 3)]


@pytest.mark.parametrize(
    ("args", "method", "suffix", "on_cluster"),
    MATRIX,
    ids=[f"{c[0][0]}-{'cluster' if c[3] else 'organization'}" for c in MATRIX],
)
def test_approvals_commands_call_the_spec_paths(
    shared_admin: Meshctl, org: str, args: list[str], method: str, suffix: str, on_cluster: bool
) -> None:
    target = f"organizations/{org}" + ("/clusters/c1" if on_cluster else "")
    where = ["--org", org, *(["--cluster", "c1"] if on_cluster else [])]
    result = shared_admin.run("-v", "approvals", *args, *where)
    request_line = f"> {method} /v2/{target}/approvals{suffix}"
    assert request_line in result.stderr.splitlines(), result.stderr
    status = int(re.search(r"^< (\d+)$", result.stderr, re.M).group(1))  # type: ignore[union-attr]
    assert result.returncode == EXIT_FOR_STATUS[status], result.stderr
    if status >= 400:
        errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
        assert len(errors) == 1 and f"({status})" in errors[0]


def test_approvals_without_enough_input_are_usage_errors(shared_admin: Meshctl, org: str) -> None:
    assert "--mode must be one of" in shared_admin.fails(
        2, "approvals", "set-policy", "--org", org, "--mode", "SOMETIMES"
    )
    assert "give --subject and at least one --permission" in shared_admin.fails(
        2, "approvals", "request", "--org", org, "--subject", "organizations/x/users/u"
    )
    assert "approvals need --org" in shared_admin.fails(2, "approvals", "get")
