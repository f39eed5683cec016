"""Config validation (errors name file, line and field) and live reload."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from extauthz.config import load_config
from extauthz.paths import PathMatch
from meshplane.config_error import ConfigError
from meshplane.metrics import render_latest

from .cases import GOOD
from .jwtkit import HS_SECRET, OTHER_SECRET, claims, make_token, public_pem, rsa_key
from .metricsutil import sample
from .policies import write_policies
from .support import GrpcClient, ServerThread, app_factory, check_request

BASE = """defaultPolicy: p
policies:
  - name: p
    jwt:
      algorithms: [HS256]
      keys:
        - hmacSecret: {value: a-long-enough-demo-secret}
"""


def load(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("text", "line", "field", "message"),
    [
        (BASE.replace("algorithms:", "algorithm:"), 5, "policies[0].jwt.algorithm", "unknown key"),
        (BASE.replace("    jwt:", "    jwtt:"), 4, "policies[0].jwtt", "unknown key"),
        (
            BASE.replace("defaultPolicy: p\n", "defaultPolicy: p\nextra: 1\n"),
            2,
            "extra",
            "unknown key",
        ),
        (BASE.replace("  - name: p\n", "  - nam: p\n"), 3, "policies[0].nam", "unknown key"),
        (
            BASE.replace("[HS256]", "[HS256, none]"),
            5,
            "policies[0].jwt.algorithms[1]",
            "never accepted",
        ),
        (
            BASE.replace("[HS256]", "[HS257]"),
            5,
            "policies[0].jwt.algorithms[0]",
            "unsupported algorithm",
        ),
        (BASE.replace("[HS256]", "[]"), 5, "policies[0].jwt.algorithms", "non-empty"),
        (
            BASE.replace("[HS256]", "[RS256]"),
            7,
            "policies[0].jwt.keys[0].hmacSecret",
            "usable by none",
        ),
        (
            BASE.replace("{value: a-long-enough-demo-secret}", "{file: missing.key}"),
            7,
            "policies[0].jwt.keys[0].hmacSecret.file",
            "cannot read",
        ),
        (
            BASE.replace("{value: a-long-enough-demo-secret}", "{env: EXTAUTHZ_UNSET_VAR}"),
            7,
            "policies[0].jwt.keys[0].hmacSecret",
            "EXTAUTHZ_UNSET_VAR",
        ),
        (
            BASE.replace("{value: a-long-enough-demo-secret}", "{value: a, file: b}"),
            7,
            "policies[0].jwt.keys[0].hmacSecret",
            "exactly one",
        ),
        (BASE.replace("defaultPolicy: p", "defaultPolicy: q"), 1, "defaultPolicy", "neither"),
        (
            BASE.replace("name: p", "name: allow").replace(
                "defaultPolicy: p", "defaultPolicy: allow"
            ),
            3,
            "policies[0].name",
            "not be allow/deny",
        ),
        (
            BASE + "    pathClaim: {match: REGEX}\n",
            8,
            "policies[0].pathClaim.match",
            "PREFIX or SEGMENT",
        ),
        (
            BASE + "    claimsToHeaders: [{claim: sub, header: authorization}]\n",
            8,
            "policies[0].claimsToHeaders[0].header",
            "reserved",
        ),
        (BASE + "      leewaySeconds: '5'\n", 8, "policies[0].jwt.leewaySeconds", "number"),
        (BASE + "      leewaySeconds: true\n", 8, "policies[0].jwt.leewaySeconds", "number"),
        (
            BASE + "        - jwks: {uri: 'ftp://idp/keys'}\n",
            8,
            "policies[0].jwt.keys[1].jwks.uri",
            "must be an absolute http/https URL, got 'ftp://idp/keys'",
        ),
        (
            BASE + "        - jwks: {uri: 'https://idp/keys', cacheSecond: 5}\n",
            8,
            "policies[0].jwt.keys[1].jwks.cacheSecond",
            "unknown key",
        ),
        (
            BASE.replace("jwt:\n      algorithms", "jwt:\n      issuer: ''\n      algorithms"),
            5,
            "policies[0].jwt.issuer",
            "non-empty",
        ),
        (BASE + BASE.split("policies:\n")[1], 8, "policies[1].name", "duplicate"),
        ("defaultPolicy: [p]\n", 1, "defaultPolicy", "non-empty string"),
        ("policies: []\n", 1, "defaultPolicy", "is required"),
        ("defaultPolicy: p\n  bad: [\n", 2, None, "invalid YAML"),
    ],
)
def test_invalid_configs_name_file_line_and_field(
    tmp_path: Path, text: str, line: int | None, field: str | None, message: str
) -> None:
    path = load(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    error = info.value
    assert error.source == str(path)
    if line is not None:
        assert error.line == line, str(error)
    assert error.field == field, str(error)
    assert message in error.message, str(error)
    assert str(error).startswith(f"{path}:")


def test_key_files_relative_to_config_and_weak_rsa_rejected(tmp_path: Path) -> None:
    from cryptography.hazmat.primitives.asymmetric import rsa

    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "rsa.pem").write_bytes(public_pem(rsa_key()))
    text = (
        BASE.replace("[HS256]", "[HS256, RS256]") + "        - publicKeyPem: {file: keys/rsa.pem}\n"
    )
    config = load_config(load(tmp_path, text))
    assert len(config.policies["p"].jwt.static_keys) == 2
    weak = rsa.generate_private_key(public_exponent=65537, key_size=1024)
    (tmp_path / "keys" / "rsa.pem").write_bytes(public_pem(weak))
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "c.yaml")
    assert "2048" in str(info.value)


def test_public_key_as_hmac_secret_is_refused(tmp_path: Path) -> None:
    # HS/RS confusion starts with an operator pasting a public key as a secret.
    (tmp_path / "rsa.pem").write_bytes(public_pem(rsa_key()))
    text = BASE.replace("{value: a-long-enough-demo-secret}", "{file: rsa.pem}")
    with pytest.raises(ConfigError) as info:
        load_config(load(tmp_path, text))
    assert info.value.field == "policies[0].jwt.keys[0].hmacSecret"
    assert "asymmetric" in info.value.message


def test_demo_policy_loads() -> None:
    config = load_config(Path(__file__).parents[2] / "deploy" / "extauthz" / "demo-policy.yaml")
    assert config.default_policy == "tsb-jwt"
    policy = config.policies["tsb-jwt"]
    assert policy.jwt.algorithms == {"HS256"}
    assert policy.path_claim is not None and policy.path_claim.match is PathMatch.PREFIX


def test_live_reload_and_last_good_config(tmp_path: Path) -> None:
    os.environ["EXTAUTHZ_TEST_SECRET"] = HS_SECRET.decode()
    try:
        path = write_policies(tmp_path)
        original = path.read_text()
        with ServerThread(app_factory(path, reload_interval=0.05)) as server:
            client = GrpcClient(server.port)
            request = check_request("/headers", {"authorization": f"Bearer {GOOD}"})

            def reason() -> str:
                response = client.check(request)
                return "ok" if response.status.code == 0 else response.status.message

            assert reason() == "ok"
            path.write_text(original.replace("defaultPolicy: hs", "defaultPolicy: deny"))
            wait_for(lambda: reason() == "deny_policy")
            errors = sample(
                render_latest().decode(),
                "meshplane_config_reloads_total",
                config="extauthz",
                result="error",
            )
            path.write_text(original.replace("defaultPolicy: hs", "defaultPolicy: hs\nbogus: 1"))
            wait_for(
                lambda: (
                    sample(
                        render_latest().decode(),
                        "meshplane_config_reloads_total",
                        config="extauthz",
                        result="error",
                    )
                    > errors
                )
            )
            assert reason() == "deny_policy"  # the last good config stays live
            path.write_text(original)
            wait_for(lambda: reason() == "ok")
            client.close()
    finally:
        os.environ.pop("EXTAUTHZ_TEST_SECRET", None)


def wait_for(predicate: object, timeout: float = 10.0) -> None:
    assert callable(predicate)
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)


def test_rotated_key_file_is_picked_up_without_policy_change(tmp_path: Path) -> None:
    os.environ["EXTAUTHZ_TEST_SECRET"] = HS_SECRET.decode()
    try:
        path = write_policies(tmp_path)
        with ServerThread(app_factory(path, reload_interval=0.05)) as server:
            client = GrpcClient(server.port)
            new_token = make_token(claims(time.time()), key=OTHER_SECRET)

            def reason(token: str) -> str:
                response = client.check(
                    check_request("/headers", {"authorization": f"Bearer {token}"})
                )
                return "ok" if response.status.code == 0 else str(response.status.message)

            assert reason(GOOD) == "ok"
            assert reason(new_token) == "bad_signature"
            (tmp_path / "hs.secret").write_bytes(OTHER_SECRET)
            wait_for(lambda: reason(new_token) == "ok")
            assert reason(GOOD) == "bad_signature"  # cached verdict gone with the old key
            client.close()
    finally:
        os.environ.pop("EXTAUTHZ_TEST_SECRET", None)
