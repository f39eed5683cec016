"""The snapshot form of the config: a directory with at most one policy file."""

from __future__ import annotations

from pathlib import Path

import pytest

from extauthz.config import load_config
from meshplane.config_error import ConfigError

DEMO = Path(__file__).parents[2] / "deploy" / "extauthz" / "demo-policy.yaml"


def test_an_empty_directory_denies_everything(tmp_path: Path) -> None:
    config = load_config(tmp_path)
    assert config.default_policy == "deny"
    assert dict(config.policies) == {}


def test_a_directory_with_one_file_loads_it(tmp_path: Path) -> None:
    (tmp_path / "extauthz.yaml").write_text(DEMO.read_text())
    (tmp_path / ".version").write_text("v1\n")  # hidden files are the subscriber's
    assert "tsb-jwt" in load_config(tmp_path).policies


def test_a_directory_with_two_files_is_refused(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(DEMO.read_text())
    (tmp_path / "b.yaml").write_text(DEMO.read_text())
    with pytest.raises(ConfigError, match="one policy file"):
        load_config(tmp_path)


def test_errors_in_the_directory_file_name_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "extauthz.yaml"
    bad.write_text(DEMO.read_text().replace("algorithms: [HS256]", "algorithms: [none]", 1))
    with pytest.raises(ConfigError) as exc:
        load_config(tmp_path)
    assert exc.value.source == str(bad)
