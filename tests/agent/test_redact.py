"""The redaction every diagnostics answer passes (agent.redact), table-tested: pure.

Key names come from real Envoy configs (the fields of config dumps and
``/server_info``) and from what users put in metadata; the end-to-end check
against a real Envoy's dump is in ``test_proxytools_e2e.py``.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from agent.redact import REDACTED, is_secret_name, redact, redact_text

PEM = "-----BEGIN PRIVATE KEY-----\nMIIE\n-----END PRIVATE KEY-----"
CERT = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
# JWKs: a symmetric key (all of it is the secret), an RSA private key (n, e public).
OCT = {"kty": "oct", "kid": "h", "alg": "HS256", "k": "c2VjcmV0LXNlY3JldC1zZWNyZXQ"}
RSA = {"kty": "RSA", "kid": "r", "n": "0vx7", "e": "AQAB", "d": "X4cT", "p": "83i-"}
RSA_MORE = {"q": "3dfO", "dp": "G4sP", "dq": "s9lA", "qi": "GyM_", "oth": [{"r": "a", "d": "b"}]}
R = REDACTED
OCT_REDACTED = {**OCT, "k": R}
RSA_REDACTED = {**RSA, "d": R, "p": R}
JWKS_TEXT = json.dumps({"keys": [OCT, RSA]})

SECRET_NAMES = [
    "password",
    "db_password",
    "DB_PASSWORD",
    "passwd",
    "passphrase",
    "secret",
    "client_secret",
    "clientSecret",
    "hmac_secret",
    "token_secret",
    "token",
    "auth_token",
    "authToken",
    "access_token",
    "refresh_token",
    "id_token",
    "x-auth-token",
    "api_key",
    "apiKey",
    "apikey",
    "X-Api-Key",
    "stripe_api_key",
    "private_key",
    "privateKey",
    "aws_secret_access_key",
    "awsSecretAccessKey",
    "AWS_SECRET_ACCESS_KEY",
    "access_key",
    "signing_key",
    "session_ticket_keys",
    "credential",
    "credentials",
    "authorization",
    "Authorization",
    "proxy-authorization",
    "cookie",
    "set-cookie",
    "session_cookie",
    "bearer",
    "metadata.db_password",
]
ORDINARY_NAMES = [
    "key",
    "value",
    "name",
    "max_tokens",
    "tokens_per_fill",
    "token_bucket",
    "fill_interval",
    "keyspace",
    "primary_key_hash",
    "hash_key",
    "cluster_name",
    "token_endpoint",
    "authorization_endpoint",
    "client_id",
    "tls_certificate_sds_secret_configs",
    "validation_context_sds_secret_config",
    "dynamic_active_secrets",
    "static_secrets",
    "sds_config",
    "cookie_names",
    "password_file",
    "forward_payload_header",
    "from_headers",
    "common_tls_context",
    "certificate_chain",
    "trusted_ca",
    "stat_prefix",
    "per_connection_buffer_limit_bytes",
    "request_headers_to_add",
    "x-request-id",
    "user-agent",
    "secret_name",
    "plain",
    "keepalive",
    "monkey",
    "tokenizer_mode",
]


@pytest.mark.parametrize("name", SECRET_NAMES)
def test_secret_names(name: str) -> None:
    assert is_secret_name(name)


@pytest.mark.parametrize("name", ORDINARY_NAMES)
def test_ordinary_names(name: str) -> None:
    assert not is_secret_name(name)


@pytest.mark.parametrize(
    ("document", "expected", "count"),
    [
        ({"password": "hunter2"}, {"password": REDACTED}, 1),
        (
            {"db_password": "x", "client_secret": "y", "pin_count": 3},
            {"db_password": REDACTED, "client_secret": REDACTED, "pin_count": 3},
            2,
        ),
        # an object under a secret name: every value, but what locates the secret
        ({"private_key": {"inline_string": "k"}}, {"private_key": {"inline_string": REDACTED}}, 1),
        ({"private_key": {"filename": "/k.pem"}}, {"private_key": {"filename": "/k.pem"}}, 0),
        (
            {"token_secret": {"name": "oauth", "sds_config": {"path": "/sds"}}},
            {"token_secret": {"name": "oauth", "sds_config": {"path": "/sds"}}},
            0,
        ),
        (
            {"credentials": {"client_id": "c", "username": "u", "password": "p"}},
            {"credentials": {"client_id": "c", "username": REDACTED, "password": REDACTED}},
            2,
        ),
        (
            {"privateKey": "k", "apiKey": "a", "access_token": "t", "awsSecretAccessKey": 1},
            {
                "privateKey": REDACTED,
                "apiKey": REDACTED,
                "access_token": REDACTED,
                "awsSecretAccessKey": REDACTED,
            },
            4,
        ),
        ({"note": PEM}, {"note": REDACTED}, 1),
        ({"list": ["ok", PEM]}, {"list": ["ok", REDACTED]}, 1),
        (
            {"header": {"key": "Authorization", "value": "Bearer abc"}},
            {"header": {"key": "Authorization", "value": REDACTED}},
            1,
        ),
        (
            {"header": {"key": "X-Api-Key", "value": "abc"}},
            {"header": {"key": "X-Api-Key", "value": REDACTED}},
            1,
        ),
        (
            {"header": {"key": "x-api-key", "raw_value": "YWJj"}},
            {"header": {"key": "x-api-key", "raw_value": REDACTED}},
            1,
        ),
        # a route or query parameter matcher on a credential holds the credential
        (
            {"name": "x-api-key", "string_match": {"exact": "k1", "ignore_case": False}},
            {"name": "x-api-key", "string_match": {"exact": REDACTED, "ignore_case": False}},
            1,
        ),
        (
            {"name": "api_key", "exact_match": "k2", "invert_match": False},
            {"name": "api_key", "exact_match": REDACTED, "invert_match": False},
            1,
        ),
        (
            {"name": "authorization", "present_match": True},
            {"name": "authorization", "present_match": True},
            0,
        ),
        # an object merely named like a secret keeps its fields
        (
            {"name": "token-service", "type": "STRICT_DNS", "connect_timeout": "1s"},
            {"name": "token-service", "type": "STRICT_DNS", "connect_timeout": "1s"},
            0,
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
        ({"cert": CERT}, {"cert": CERT}, 0),
        # a secret's certificate is public; its key is not (SecretsConfigDump)
        (
            {"secret": {"name": "s", "tls_certificate": {"certificate_chain": CERT, "x": "k"}}},
            {
                "secret": {
                    "name": "s",
                    "tls_certificate": {"certificate_chain": CERT, "x": REDACTED},
                }
            },
            1,
        ),
        # /logging: logger names are not field names (Envoy has a logger called secret)
        (
            {"levels": {"secret": "info", "upstream": "debug"}},
            {"levels": {"secret": "info", "upstream": "debug"}},
            0,
        ),
        ({"enabled": True, "password": False}, {"enabled": True, "password": False}, 0),
        # text inside a JSON answer (server_info's config_yaml)
        (
            {"config_yaml": "db:\n  password: hunter2\n  host: db"},
            {"config_yaml": f"db:\n  password: {REDACTED}\n  host: db"},
            1,
        ),
        (
            {"stats": [{"name": "http.jwt_authn.token_missing", "value": 3}]},
            {"stats": [{"name": "http.jwt_authn.token_missing", "value": 3}]},
            0,
        ),
        # JWKs: private and symmetric members, wherever the JWK is (names do not tell)
        ({"keys": [OCT]}, {"keys": [OCT_REDACTED]}, 1),
        (
            {"jwk": {**RSA, **RSA_MORE}},
            {"jwk": {**RSA_REDACTED, **dict.fromkeys(RSA_MORE, R), "oth": [{"r": R, "d": R}]}},
            8,
        ),
        # ... in a string holding a JWKS (jwt_authn's local_jwks in a config dump)
        (
            {"local_jwks": {"inline_string": JWKS_TEXT}},
            {
                "local_jwks": {
                    "inline_string": json.dumps(
                        {"keys": [OCT_REDACTED, RSA_REDACTED]}, separators=(",", ":")
                    )
                }
            },
            3,
        ),
        # a public JWKS, and members of that name outside a JWK, stay readable
        (
            {"keys": [{"kty": "RSA", "n": "0vx7", "e": "AQAB"}], "p": "1", "d": "x"},
            {"keys": [{"kty": "RSA", "n": "0vx7", "e": "AQAB"}], "p": "1", "d": "x"},
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


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        # Envoy's debug dump of request headers
        ("'authorization', 'Bearer abc.def'", f"'authorization', '{REDACTED}'"),
        ("'x-api-key', 'k1'", f"'x-api-key', '{REDACTED}'"),
        ("'cookie', 'a=1; session=xyz'", f"'cookie', '{REDACTED}'"),
        ("':path', '/shop?page=2'", "':path', '/shop?page=2'"),
        ("'user-agent', 'curl/8.5'", "'user-agent', 'curl/8.5'"),
        # header lines, JSON access logs, query strings
        ("Authorization: Basic dXNlcjpw", f"Authorization: {REDACTED}"),
        ("proxy-authorization: Bearer t", f"proxy-authorization: {REDACTED}"),
        ("cookie: a=1; session=xyz", f"cookie: {REDACTED}"),
        (
            '{"authorization":"Bearer q","x-api-key":"k","path":"/a"}',
            f'{{"authorization":"{REDACTED}","x-api-key":"{REDACTED}","path":"/a"}}',
        ),
        (
            "GET /a?x=1&api_key=SEC&b=2 HTTP/1.1",
            f"GET /a?x=1&api_key={REDACTED}&b=2 HTTP/1.1",
        ),
        ("url: http://h/?token=T&y=1", f"url: http://h/?token={REDACTED}&y=1"),
        # a bearer token anywhere, a password in a URL, a private key block
        ("upstream sent Bearer eyJhbGciOi.x.y back", f"upstream sent Bearer {REDACTED} back"),
        ("dial postgres://app:pw123@db:5432/x", f"dial postgres://app:{REDACTED}@db:5432/x"),
        (f"key follows {PEM} done", f"key follows {REDACTED} done"),
        # ordinary lines stay as they are
        ("max_tokens: 100, tokens_per_fill=10", "max_tokens: 100, tokens_per_fill=10"),
        (
            "[2026-01-01 10:00:00.000][12][debug][http] new stream",
            "[2026-01-01 10:00:00.000][12][debug][http] new stream",
        ),
        ("cluster 'backend' token_bucket: 5", "cluster 'backend' token_bucket: 5"),
        ("https://host:8443/path@v2", "https://host:8443/path@v2"),
        ("Basic authentication failed", "Basic authentication failed"),
        ("the bearer token is expired", "the bearer token is expired"),
        ("Jwt verification fails: Jwt is expired", "Jwt verification fails: Jwt is expired"),
        # a JWKS in a log line, as JSON or escaped inside a string
        (
            f"Invalid inline jwks for issuer: i, jwks: {json.dumps({'keys': [OCT]})}",
            "Invalid inline jwks for issuer: i, jwks: " + json.dumps({"keys": [OCT_REDACTED]}),
        ),
        (json.dumps(json.dumps(RSA)), json.dumps(json.dumps(RSA_REDACTED))),
    ],
)
def test_redact_text(line: str, expected: str) -> None:
    assert redact_text(line)[0] == expected
