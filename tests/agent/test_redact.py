"""Redaction of config dumps (agent.redact), table-tested: pure."""

from __future__ import annotations

from typing import Any

import pytest

from agent.redact import REDACTED, redact

PEM = "-----BEGIN PRIVATE KEY-----\nMIIE\n-----END PRIVATE KEY-----"


@pytest.mark.parametrize(
    ("document", "expected", "count"),
    [
        ({"password": "hunter2"}, {"password": REDACTED}, 1),
        (
            {"db_password": "x", "client_secret": "y"},
            {"db_password": REDACTED, "client_secret": REDACTED},
            2,
        ),
        ({"private_key": {"inline_string": "k"}}, {"private_key": REDACTED}, 1),
        (
            {"privateKey": "k", "apiKey": "a", "access_token": "t"},
            {"privateKey": REDACTED, "apiKey": REDACTED, "access_token": REDACTED},
            3,
        ),
        ({"note": PEM}, {"note": REDACTED}, 1),
        ({"list": ["ok", PEM]}, {"list": ["ok", REDACTED]}, 1),
        (
            {"header": {"key": "Authorization", "value": "Bearer abc"}},
            {"header": {"key": "Authorization", "value": REDACTED}},
            1,
        ),
        (
            {"header": {"key": "x-request-id", "value": "keep"}},
            {"header": {"key": "x-request-id", "value": "keep"}},
            0,
        ),
        # Envoy's own redaction, and empty values, are left as they are (not counted)
        ({"private_key": REDACTED, "password": ""}, {"private_key": REDACTED, "password": ""}, 0),
        # ordinary fields that merely mention secrets survive
        (
            {"dynamic_active_secrets": [], "name": "secret-holder", "sds_config": {}},
            {"dynamic_active_secrets": [], "name": "secret-holder", "sds_config": {}},
            0,
        ),
        (
            {"cert": "-----BEGIN CERTIFICATE-----\nAAA"},
            {"cert": "-----BEGIN CERTIFICATE-----\nAAA"},
            0,
        ),
    ],
)
def test_redact(document: Any, expected: Any, count: int) -> None:
    assert redact(document) == (expected, count)


def test_redact_does_not_change_its_input() -> None:
    document = {"a": {"password": "p"}}
    redact(document)
    assert document == {"a": {"password": "p"}}
