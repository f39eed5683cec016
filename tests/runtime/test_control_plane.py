"""``meshplane.control_plane``: credentials formats, flag validation, tokens.

The tokens must verify with the management API's own verifier, since that is
what the distribution stream runs.
"""

from __future__ import annotations

import argparse
import base64
import json
import time
from pathlib import Path

import pytest
import yaml

from meshplane.config_error import ConfigError
from meshplane.control_plane import add_arguments, load_credentials, options_from
from mgmt_api.auth import keys as keymod
from mgmt_api.auth.tokens import DISTRIBUTION_AUDIENCE, TokenError, verify_service_account

CLUSTER_FQN = "organizations/o/clusters/c"
SA_FQN = CLUSTER_FQN + "/serviceaccounts/agent"


@pytest.fixture(scope="module")
def pair() -> keymod.KeyPair:
    return keymod.generate()


def template_secret(pair: keymod.KeyPair) -> dict[str, str]:
    """``installTemplate.helm.secrets.clusterServiceAccount`` as the API returns it."""
    return {
        "clusterFqn": CLUSTER_FQN,
        "serviceAccountFqn": SA_FQN,
        "keyId": pair.id,
        "jwk": json.dumps(pair.private_jwk),
        "encodedJwk": keymod.encode_jwk(pair.private_jwk),
    }


@pytest.mark.parametrize("form", ["template-json", "template-yaml", "jwk", "encoded"])
def test_every_credentials_form_signs_stream_tokens_the_management_plane_accepts(
    tmp_path: Path, pair: keymod.KeyPair, form: str
) -> None:
    secret = template_secret(pair)
    text = {
        "template-json": json.dumps(secret),
        "template-yaml": yaml.safe_dump({"clusterServiceAccount": secret}),
        "jwk": secret["jwk"],
        "encoded": secret["encodedJwk"] + "\n",
    }[form]
    path = tmp_path / "credentials"
    path.write_text(text)
    key = load_credentials(path)
    assert key.key_id == pair.id
    now = time.time()
    token = key.token(now)
    claims = verify_service_account(
        pair.public_jwk, token, now, 3600, audience=DISTRIBUTION_AUDIENCE
    )
    assert claims.expires_at - claims.issued_at == 300
    with pytest.raises(TokenError):  # a stream token is no REST credential
        verify_service_account(pair.public_jwk, token, now, 3600)
    if form.startswith("template"):
        assert (key.subject, key.cluster_fqn) == (SA_FQN, CLUSTER_FQN)


def test_a_token_from_another_key_is_rejected(tmp_path: Path, pair: keymod.KeyPair) -> None:
    path = tmp_path / "credentials"
    path.write_text(json.dumps(template_secret(keymod.generate())))
    with pytest.raises(TokenError):
        verify_service_account(pair.public_jwk, load_credentials(path).token(), time.time(), 3600)


@pytest.mark.parametrize(
    "text",
    [
        "not a key",
        base64.b64encode(b"[1, 2]").decode(),
        json.dumps({"kty": "EC", "crv": "P-256", "x": "AA", "y": "AA", "kid": "k"}),  # public
    ],
)
def test_unusable_credentials_stop_the_start(tmp_path: Path, text: str) -> None:
    path = tmp_path / "credentials"
    path.write_text(text)
    with pytest.raises(ConfigError):
        load_credentials(path)


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config")
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_flags(tmp_path: Path, pair: keymod.KeyPair) -> None:
    creds = tmp_path / "credentials"
    creds.write_text(json.dumps(template_secret(pair)))
    assert options_from(_args("--config", "x.yaml"), "ratelimit") is None
    options = options_from(
        _args("--control-plane", "127.0.0.1:8444", "--cluster", "o/c", "--credentials", str(creds)),
        "ratelimit",
    )
    assert options is not None
    assert (options.organization, options.cluster) == ("o", "c")
    assert options.cache_dir.name == "ratelimit-o-c"


@pytest.mark.parametrize(
    ("argv", "field"),
    [
        ((), None),
        (("--config", "x", "--cluster", "o/c"), "--cluster"),
        (("--config", "x", "--control-plane", "h:1"), "--config"),
        (("--control-plane", "nope", "--cluster", "o/c"), "--control-plane"),
        (("--control-plane", "h:1", "--cluster", "oc"), "--cluster"),
        (("--control-plane", "h:1", "--cluster", "o/c"), "--credentials"),
        (
            ("--control-plane", "h:1", "--cluster", "o/other", "--credentials", "CREDS"),
            "--credentials",
        ),
    ],
)
def test_bad_flags_name_the_flag(
    tmp_path: Path, pair: keymod.KeyPair, argv: tuple[str, ...], field: str | None
) -> None:
    creds = tmp_path / "credentials"
    creds.write_text(json.dumps(template_secret(pair)))
    argv = tuple(str(creds) if a == "CREDS" else a for a in argv)
    with pytest.raises(ConfigError) as exc:
        options_from(_args(*argv), "extauthz")
    assert exc.value.field == field
