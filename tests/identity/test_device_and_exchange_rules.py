"""Pure rules: RFC 8628 polling reactions and the token-exchange claim rules."""

from __future__ import annotations

from typing import Any

import pytest

from meshplane.oauth_device import DeviceAuthorization, DeviceFlowError, next_interval
from mgmt_api.identity.errors import TokenExchangeRefusedError
from mgmt_api.identity.token_exchange import (
    ACCESS_TOKEN_TYPE,
    TOKEN_EXCHANGE_GRANT,
    TokenExchangeRequestError,
    check_exchange_claims,
    parse_token_exchange_request,
)


@pytest.mark.parametrize(
    ("error", "interval", "expected"),
    [
        ("authorization_pending", 5.0, 5.0),
        ("slow_down", 5.0, 10.0),
        ("slow_down", 10.0, 15.0),
    ],
)
def test_polling_intervals(error: str, interval: float, expected: float) -> None:
    assert next_interval(error, interval) == expected


@pytest.mark.parametrize("error", ["access_denied", "expired_token", "invalid_grant", ""])
def test_polling_stops_on_final_errors(error: str) -> None:
    with pytest.raises(DeviceFlowError) as stopped:
        next_interval(error, 5.0)
    assert stopped.value.error == (error or "invalid_response")


def test_device_authorization_defaults_the_interval_to_5s() -> None:
    auth = DeviceAuthorization.from_response(
        {
            "device_code": "d",
            "user_code": "U",
            "verification_uri": "https://idp/device",
            "expires_in": 600,
        }
    )
    assert auth.interval == 5.0 and auth.verification_uri_complete is None
    with pytest.raises(DeviceFlowError):
        DeviceAuthorization.from_response({"user_code": "U"})


NOW = 1_700_000_000.0
V2: dict[str, Any] = {
    "iss": "https://idp/v2.0",
    "ver": "2.0",
    "azp": "robot",
    "sub": "robot",
    "exp": NOW + 60,
    "iat": NOW - 1,
}


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({}, None),
        (
            {"ver": "1.0", "appid": "robot", "azp": None, "iss": "https://sts.windows.net/t/"},
            "token_version_1",
        ),
        ({"ver": None, "appid": "robot", "azp": None}, "token_version_1"),
        ({"ver": "3.0"}, "token_version_unsupported"),
        ({"ver": None}, "token_version_unsupported"),
        ({"iss": "https://elsewhere"}, "wrong_issuer"),
        ({"exp": NOW - 120}, "expired"),
        ({"azp": "someone-else"}, "client_not_allowed"),
        ({"azp": None}, "client_not_allowed"),
        ({"azp": None, "appid": "robot"}, None),
        ({"sub": None}, "missing_sub"),
    ],
)
def test_token_exchange_claim_rules(changes: dict[str, Any], reason: str | None) -> None:
    claims = {k: v for k, v in {**V2, **changes}.items() if v is not None}
    if reason is None:
        subject = check_exchange_claims(
            claims, issuer="https://idp/v2.0", allowed_client_id="robot", now=NOW
        )
        assert subject.subject == claims["sub"] and subject.client_id == "robot"
    else:
        with pytest.raises(TokenExchangeRefusedError) as refused:
            check_exchange_claims(
                claims, issuer="https://idp/v2.0", allowed_client_id="robot", now=NOW
            )
        assert refused.value.reason == reason


@pytest.mark.parametrize(
    ("aud", "accepted"),
    [
        ("api://mp", True),
        (["other", "mp"], True),
        ("other", False),
        (["other", "api://mp-not"], False),
        (None, False),
    ],
)
def test_token_exchange_audience_must_name_the_management_plane(
    aud: str | list[str] | None, accepted: bool
) -> None:
    claims = {k: v for k, v in {**V2, "aud": aud}.items() if v is not None}

    def check() -> str:
        return check_exchange_claims(
            claims,
            issuer="https://idp/v2.0",
            allowed_client_id="robot",
            now=NOW,
            audiences=frozenset({"api://mp", "mp"}),
        ).subject

    if accepted:
        assert check() == "robot"
    else:
        with pytest.raises(TokenExchangeRefusedError) as refused:
            check()
        assert refused.value.reason == "wrong_audience"


@pytest.mark.parametrize(
    ("form", "error"),
    [
        ({"grant_type": "password"}, "unsupported_grant_type"),
        (
            {"grant_type": TOKEN_EXCHANGE_GRANT, "subject_token_type": ACCESS_TOKEN_TYPE},
            "invalid_request",
        ),
        (
            {
                "grant_type": TOKEN_EXCHANGE_GRANT,
                "subject_token": "t",
                "subject_token_type": "urn:x",
            },
            "invalid_request",
        ),
        (
            {
                "grant_type": TOKEN_EXCHANGE_GRANT,
                "subject_token": "t",
                "subject_token_type": ACCESS_TOKEN_TYPE,
                "requested_token_type": "urn:ietf:params:oauth:token-type:id_token",
            },
            "invalid_target",
        ),
        (
            {
                "grant_type": TOKEN_EXCHANGE_GRANT,
                "subject_token": "t",
                "subject_token_type": ACCESS_TOKEN_TYPE,
                "actor_token": "a",
            },
            "invalid_request",
        ),
    ],
)
def test_token_exchange_request_validation(form: dict[str, str], error: str) -> None:
    with pytest.raises(TokenExchangeRequestError) as bad:
        parse_token_exchange_request(form)
    assert bad.value.error == error


def test_token_exchange_request_does_not_print_the_token() -> None:
    request = parse_token_exchange_request(
        {
            "grant_type": TOKEN_EXCHANGE_GRANT,
            "subject_token": "secret-token",
            "subject_token_type": ACCESS_TOKEN_TYPE,
        }
    )
    assert "secret-token" not in repr(request)
