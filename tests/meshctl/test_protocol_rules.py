"""Pure rules, table-tested in-process: RFC 8628 polling reactions and error rendering."""

from __future__ import annotations

import pytest

from meshctl.errors import ApiFailure, Exit
from meshctl.oauth import DeviceLoginError, next_interval


@pytest.mark.parametrize(
    ("error", "interval", "expected"),
    [("authorization_pending", 5.0, 5.0), ("slow_down", 5.0, 10.0), ("slow_down", 10.0, 15.0)],
)
def test_polling_continues_and_slow_down_adds_five_seconds(
    error: str, interval: float, expected: float
) -> None:
    assert next_interval(error, interval) == expected


@pytest.mark.parametrize("error", ["access_denied", "expired_token", "invalid_grant", ""])
def test_polling_ends_on_every_other_answer(error: str) -> None:
    with pytest.raises(DeviceLoginError) as raised:
        next_interval(error, 5.0)
    assert raised.value.exit_code == Exit.AUTH
    assert raised.value.error == (error or "invalid_response")


@pytest.mark.parametrize(
    ("status", "body", "code", "exit_code"),
    [
        (409, {"code": 10, "message": "m", "details": [{"reason": "ABORTED"}]}, "ABORTED", 5),
        (409, {"code": 6, "message": "m"}, "ALREADY_EXISTS", 5),
        (404, {"code": 5, "message": "m"}, "NOT_FOUND", 4),
        (403, {"code": 7, "message": "m"}, "PERMISSION_DENIED", 3),
        (401, None, "UNAUTHENTICATED", 3),
        (400, {"code": 9, "message": "m"}, "FAILED_PRECONDITION", 1),
        (429, {"code": 8, "message": "m"}, "RESOURCE_EXHAUSTED", 1),
        (502, "<html>bad gateway</html>", "UNKNOWN", 1),
    ],
)
def test_api_errors_map_to_codes_and_exit_codes(
    status: int, body: object, code: str, exit_code: int
) -> None:
    failure = ApiFailure.from_response(status, body, retry_after="7")
    assert failure.code_name == code
    assert failure.exit_code == exit_code
    assert "\n" not in failure.message
    if code == "RESOURCE_EXHAUSTED":
        assert "wait 7 s" in failure.message


def test_multiline_server_messages_become_one_line() -> None:
    failure = ApiFailure.from_response(400, {"code": 3, "message": "a\nb\n\tc"})
    assert failure.message.startswith("INVALID_ARGUMENT (400): a b c;")


def test_polling_stops_at_the_code_deadline_without_another_request() -> None:
    """``expires_in`` is a hard deadline: after it, no poll is sent (port 9 is discard;
    a request there would fail as UNREACHABLE instead of expired_token)."""
    from meshctl.oauth import DeviceAuthorization, poll_for_tokens
    from meshctl.transport import Transport

    now = [0.0]
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        now[0] += seconds

    authorization = DeviceAuthorization(
        device_code="dc",
        user_code="ABCD-EFGH",
        verification_uri="http://idp.invalid/device",
        verification_uri_complete=None,
        expires_in=4.0,
        interval=5.0,
    )
    with pytest.raises(DeviceLoginError) as raised:
        poll_for_tokens(
            Transport(timeout=1.0), "http://127.0.0.1:9/token", "client", authorization,
            sleep=sleep, clock=lambda: now[0],
        )  # fmt: skip
    assert raised.value.error == "expired_token"
    assert sleeps == [5.0]


def test_device_authorization_defaults_the_interval_and_hides_the_device_code() -> None:
    from meshctl.oauth import parse_device_authorization

    parsed = parse_device_authorization(
        {"device_code": "secret-dc", "user_code": "U", "verification_uri": "https://x/d",
         "expires_in": 600}
    )  # fmt: skip
    assert parsed.interval == 5.0
    assert "secret-dc" not in repr(parsed)
    with pytest.raises(DeviceLoginError) as raised:  # meshctl's error: one line, exit 3
        parse_device_authorization({"user_code": "U"})
    assert raised.value.exit_code == Exit.AUTH


def test_an_explained_unavailable_says_only_the_servers_cause_and_fix() -> None:
    """A 503 whose body names the cause ("no agent ... is connected; start ...") is not
    followed by a generic "the management plane failed"; a bare 503 (a proxy's page) is."""
    said = ApiFailure.from_response(
        503, {"code": 14, "message": "no agent of cluster c is connected; start meshplane-agent"}
    )
    assert said.message == (
        "UNAVAILABLE (503): no agent of cluster c is connected; start meshplane-agent"
    )
    bare = ApiFailure.from_response(503, "<html>unavailable</html>")
    assert "the management plane failed" in bare.message
    internal = ApiFailure.from_response(500, {"code": 13, "message": "boom"})
    assert "the management plane failed" in internal.message
