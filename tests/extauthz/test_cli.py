"""The command line: config errors stop the start (exit 2), demo tokens verify."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from extauthz.cli import main
from extauthz.config import load_config
from extauthz.jwt_policy import CheckAttributes, Engine
from extauthz.reasons import Reason

from .support import ServerThread, app_factory

DEMO = Path(__file__).parents[2] / "deploy" / "extauthz" / "demo-policy.yaml"


def test_serve_with_invalid_config_exits_2_naming_file_and_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(DEMO.read_text().replace("algorithms: [HS256]", "algorithms: [HS256, none]", 1))
    assert main(["serve", "--config", str(bad), "--listen", "127.0.0.1:0"]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:" in err
    assert "policies[0].jwt.algorithms[1]" in err


def test_check_accepts_the_demo_policy(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--config", str(DEMO)]) == 0
    assert "tsb-jwt" in capsys.readouterr().out


def test_bad_listen_address_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--config", str(DEMO), "--listen", "nope"]) == 2
    assert "HOST:PORT" in capsys.readouterr().err


def test_token_helper_mints_a_token_the_demo_policy_accepts(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["token", "--path", "/headers", "--ttl", "600"]) == 0
    token = capsys.readouterr().out.strip()
    engine = Engine(load_config(DEMO))
    auth = (f"Bearer {token}",)
    now = time.time()
    assert engine.decide(CheckAttributes("/headers/x", auth), now).reason is Reason.OK
    assert engine.decide(CheckAttributes("/get", auth), now).reason is Reason.PATH_NOT_ALLOWED
    assert engine.decide(CheckAttributes("/headers", auth), now + 601).reason is Reason.EXPIRED


def test_token_takes_the_secret_from_the_policy_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "p.yaml"
    config.write_text(
        "defaultPolicy: p\npolicies:\n  - name: p\n    jwt:\n      algorithms: [HS256]\n"
        "      keys: [{hmacSecret: {value: a-secret-from-the-file-0123456789}, kid: k7}]\n"
        "    pathClaim: {name: prefix}\n"
    )
    assert main(["token", "--config", str(config), "--path", "/api"]) == 0
    token = capsys.readouterr().out.strip()
    engine = Engine(load_config(config))
    decision = engine.decide(CheckAttributes("/api/x", (f"Bearer {token}",)), time.time())
    assert decision.reason is Reason.OK
    assert main(["token", "--config", str(config), "--policy", "nope"]) == 2
    assert "nope" in capsys.readouterr().err


def test_check_sends_a_check_to_a_running_server(capsys: pytest.CaptureFixture[str]) -> None:
    with ServerThread(app_factory(DEMO)) as server:
        assert main(["token", "--config", str(DEMO), "--path", "/headers"]) == 0
        token = capsys.readouterr().out.strip()
        target = f"127.0.0.1:{server.port}"
        auth = f"authorization=Bearer {token}"
        assert main(["check", "--server", target, "--path", "/headers", "--header", auth]) == 0
        assert json.loads(capsys.readouterr().out)["allowed"] is True
        assert main(["check", "--server", target, "--path", "/admin", "--header", auth]) == 1
        out = json.loads(capsys.readouterr().out)
        assert out["http_status"] == 403
        assert out["headers"]["x-ext-authz-reason"] == "path_not_allowed"


def test_every_listener_defaults_to_loopback_or_off() -> None:
    """Like every meshplane service: nothing is reachable from the network unless asked
    (docs/extauthz.md says how: ``--listen 0.0.0.0:9191``, with TLS)."""
    from extauthz.cli import _parser

    args = _parser().parse_args(["serve", "--config", str(DEMO)])
    assert args.listen == "127.0.0.1:9191"
    assert args.http_listen is None and args.metrics_listen is None
    docs = (Path(__file__).parents[2] / "docs" / "extauthz.md").read_text()
    assert "--listen 0.0.0.0:9191" in docs and "--tls-cert" in docs
