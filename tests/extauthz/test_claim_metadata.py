"""Verified claims published as dynamic metadata: the values, the bounds, the wire.

Pure: the engine with an injected clock, and the gRPC adapter's encoding
(the gateway test, tests/gateway/test_identity_limits.py, shows Envoy reads it).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
from envoy.service.auth.v3 import external_auth_pb2
from google.protobuf import json_format

from extauthz.claim_metadata import KEY, MAX_CLAIMS, MAX_VALUE_BYTES, metadata_value
from extauthz.config import load_config
from extauthz.grpc_api import encode_response
from extauthz.jwt_policy import CheckAttributes, Engine
from extauthz.reasons import Reason
from meshplane.config_error import ConfigError

from .jwtkit import HS_SECRET, OTHER_SECRET, claims, make_token

NOW = 1_800_000_000.0
POLICY = f"""defaultPolicy: p
policies:
  - name: p
    jwt:
      algorithms: [HS256]
      keys:
        - hmacSecret: {{value: {HS_SECRET.decode()}}}
    pathClaim: {{name: path}}
"""


def config(tmp_path: Path, extra: str) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(POLICY + extra)
    return path


@pytest.fixture
def engine(tmp_path: Path) -> Engine:
    return Engine(load_config(config(tmp_path, "    claimsToMetadata: [sub, org, n, admin]\n")))


def published(engine: Engine, token: str, path: str = "/headers", now: float = NOW) -> Any:
    decision = engine.decide(CheckAttributes(path, (f"Bearer {token}",), None), now)
    response = external_auth_pb2.CheckResponse.FromString(encode_response(decision))
    return decision.reason, json_format.MessageToDict(response.dynamic_metadata)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("alice", "alice"),
        (42, "42"),
        (True, "true"),
        (False, "false"),
        ("", None),  # no value: Envoy would send no entry either
        (1.5, None),  # a float has no one canonical text
        (None, None),
        (["a"], None),
        ({"a": 1}, None),
        ("x" * MAX_VALUE_BYTES, "x" * MAX_VALUE_BYTES),
        ("x" * (MAX_VALUE_BYTES + 1), "sha256:" + hashlib.sha256(b"x" * 257).hexdigest()),
        ("é" * 129, "sha256:" + hashlib.sha256(("é" * 129).encode()).hexdigest()),  # 258 bytes
    ],
)
def test_what_a_claim_publishes(value: Any, expected: str | None) -> None:
    assert metadata_value(value) == expected


def test_an_allow_publishes_the_named_claims_it_carries(engine: Engine) -> None:
    token = make_token(claims(NOW, sub="alice", n=7, admin=False, email="a@example.com"))
    reason, metadata = published(engine, token)
    assert reason is Reason.OK
    # org is absent, email is not named: neither is published.
    assert metadata == {KEY: {"sub": "alice", "n": "7", "admin": "false"}}


@pytest.mark.parametrize(
    ("case", "token", "path", "now", "reason"),
    [
        ("forged", make_token(claims(NOW, sub="bob"), key=OTHER_SECRET), "/headers", NOW,
         Reason.BAD_SIGNATURE),
        ("expired", make_token(claims(NOW, sub="bob")), "/headers", NOW + 7200, Reason.EXPIRED),
        ("not yet valid", make_token(claims(NOW, sub="bob")), "/headers", NOW - 7200,
         Reason.NOT_YET_VALID),
        ("path claim", make_token(claims(NOW, sub="bob")), "/admin", NOW,
         Reason.PATH_NOT_ALLOWED),
    ],
)  # fmt: skip
def test_a_deny_publishes_nothing(
    engine: Engine, case: str, token: str, path: str, now: float, reason: Reason
) -> None:
    assert published(engine, token, path, now) == (reason, {}), case


def test_a_cached_token_still_publishes_nothing_once_expired(engine: Engine) -> None:
    token = make_token(claims(NOW, sub="carol"))
    assert published(engine, token)[1] == {KEY: {"sub": "carol"}}
    assert published(engine, token, now=NOW + 7200) == (Reason.EXPIRED, {})


def test_a_policy_without_claims_to_publish_answers_the_plain_allow(tmp_path: Path) -> None:
    engine = Engine(load_config(config(tmp_path, "")))
    assert published(engine, make_token(claims(NOW, sub="alice"))) == (Reason.OK, {})


@pytest.mark.parametrize(
    ("extra", "field", "message"),
    [
        ("    claimsToMetadata: [sub, sub]\n", "claimsToMetadata[1]", "duplicate"),
        ("    claimsToMetadata: ['a b']\n", "claimsToMetadata[0]", "visible ASCII"),
        (f"    claimsToMetadata: [{'c' * 65}]\n", "claimsToMetadata[0]", "1 to 64"),
        (
            f"    claimsToMetadata: [{', '.join(f'c{i}' for i in range(MAX_CLAIMS + 1))}]\n",
            "claimsToMetadata",
            "at most 8",
        ),
        ("    claimsToMetadata: sub\n", "claimsToMetadata", "list"),
    ],
)
def test_bad_claims_to_metadata_are_refused_naming_the_field(
    tmp_path: Path, extra: str, field: str, message: str
) -> None:
    with pytest.raises(ConfigError) as exc:
        load_config(config(tmp_path, extra))
    assert exc.value.field == f"policies[0].{field}"
    assert message in str(exc.value)
