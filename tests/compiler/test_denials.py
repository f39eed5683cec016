"""The proxies' denial table (mgmt_api.compiler.denials), pure: each refusal's
code details pick exactly one row, every kind has a row, and a proxy's line
has only the decision-line schema's keys."""

from __future__ import annotations

import re

import pytest

from meshplane import decision_log as dl
from mgmt_api.compiler import denials

_STARTS = re.compile(r"^response\.code_details\.startsWith\('(.*)'\)$")
_EQUALS = re.compile(r"^response\.code_details == '(.*)'$")


def _matches(expression: str, details: str) -> bool:
    """The two CEL forms the table uses, evaluated as Envoy does."""
    starts = _STARTS.match(expression)
    if starts:
        return details.startswith(starts.group(1))
    equals = _EQUALS.match(expression)
    assert equals, f"an expression this test cannot read: {expression}"
    return details == equals.group(1)


@pytest.mark.parametrize(
    ("details", "kind", "line"),
    [
        ("rbac_access_denied_matched_policy[mode-CUSTOM]", "mode", True),
        ("rbac_access_denied_matched_policy[mode-NAMESPACE]", "mode", True),
        ("jwt_authn_access_denied{Jwt_is_missing}", "jwt", True),
        ("jwt_authn_access_denied{Jwt_is_expired}", "jwt", True),
        ("rbac_access_denied_matched_policy[none]", "rules", True),
        ("lua_response", "extauthz", True),
        ("ext_authz_denied", "extauthz", False),
        ("request_rate_limited", "ratelimit", False),
        ("rate_limited_by_quota", "ratelimit", True),
    ],
)
def test_each_refusal_is_one_row(details: str, kind: str, line: bool) -> None:
    (row,) = [d for d in denials.DENIALS if _matches(d.details, details)]
    assert (row.kind.value, row.line) == (kind, line)


@pytest.mark.parametrize("details", ["via_upstream", "route_not_found", "ext_authz_error"])
def test_other_replies_are_no_row(details: str) -> None:
    assert not [d for d in denials.DENIALS if _matches(d.details, details)]


def test_every_kind_has_a_row_and_every_mapper_the_reason_header_or_the_id() -> None:
    assert {d.kind for d in denials.DENIALS} == set(dl.DenialKind)
    for mapper in denials.local_reply_config()["mappers"]:
        names = {h["header"]["key"] for h in mapper["headersToAdd"]}
        assert names and names <= {dl.DENIED_HEADER, dl.DECISION_ID_HEADER}
        # A value a service already sent (its own id) is kept.
        assert {h["appendAction"] for h in mapper["headersToAdd"]} == {"ADD_IF_ABSENT"}


def test_a_proxy_line_has_the_schemas_keys_only() -> None:
    for log in denials.access_logs("sidecar"):
        fields = log["typedConfig"]["logFormat"]["jsonFormat"]
        dl.check_keys(fields)
        assert fields["service"] == "sidecar" and fields["logger"] == dl.LOGGER
    with pytest.raises(ValueError, match="not decision-line keys: token"):
        dl.check_keys(["decision_id", "token"])
