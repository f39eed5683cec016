"""Live config snapshots: reload on change, keep the last good one on error."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from meshplane.config_source import ConfigError, FileSource
from meshplane.metrics import render_latest
from meshplane.yamlconf import LocatedDict, LocatedList, load_yaml, loads_yaml


def _limit_loader(path: Path) -> int:
    """A toy loader: the config is a mapping with a positive ``limit``."""
    files = sorted(path.glob("*.yaml")) if path.is_dir() else [path]
    total = 0
    for file in files:
        doc: Any = load_yaml(file)
        if not isinstance(doc, dict) or not isinstance(doc.get("limit"), int) or doc["limit"] < 1:
            line = doc.line_of("limit") if isinstance(doc, LocatedDict) else None
            raise ConfigError(
                "must be a positive integer", source=str(file), line=line, field="limit"
            )
        total += doc["limit"]
    return total


def _reload_errors() -> float:
    for line in render_latest().decode().splitlines():
        if line.startswith('meshplane_config_reloads_total{config="toy",result="error"}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def test_a_changed_file_is_picked_up(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("limit: 1\n")
    source = FileSource(cfg, _limit_loader, name="toy")
    seen: list[int] = []
    source.add_listener(seen.append)
    assert source.load_initial() == 1
    cfg.write_text("limit: 22\n")
    assert await source.reload_if_changed() is True
    assert source.current == 22
    assert seen == [1, 22]
    assert await source.reload_if_changed() is False


async def test_an_invalid_reload_keeps_the_last_good_snapshot_and_is_counted(
    tmp_path: Path,
) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("limit: 3\n")
    source = FileSource(cfg, _limit_loader, name="toy")
    source.load_initial()
    before = _reload_errors()
    cfg.write_text("other: 1\nlimit: -5\n")
    assert await source.reload_if_changed() is False
    assert source.current == 3
    assert _reload_errors() == before + 1


def test_an_invalid_initial_config_names_file_line_and_field(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("other: 1\nlimit: zero\n")
    with pytest.raises(ConfigError) as info:
        FileSource(cfg, _limit_loader, name="toy").load_initial()
    assert str(info.value) == f"{cfg}:2: limit: must be a positive integer"


async def test_a_kubernetes_configmap_symlink_swap_is_picked_up(tmp_path: Path) -> None:
    # The kubelet's layout: files are links into ..data, which links to a
    # timestamped directory; an update swaps ..data atomically.
    mount = tmp_path / "mount"
    mount.mkdir()
    for name, limit in (("..v1", 1), ("..v2", 5)):
        (mount / name).mkdir()
        (mount / name / "c.yaml").write_text(f"limit: {limit}\n")
    (mount / "..data").symlink_to("..v1")
    (mount / "c.yaml").symlink_to("..data/c.yaml")
    source = FileSource(mount, _limit_loader, name="toy")
    assert source.load_initial() == 1
    (mount / "..data_tmp").symlink_to("..v2")
    os.replace(mount / "..data_tmp", mount / "..data")
    assert await source.reload_if_changed() is True
    assert source.current == 5


def test_yaml_values_remember_their_lines() -> None:
    doc = loads_yaml("a: 1\nlist:\n  - x\n  - {k: v}\n")
    assert isinstance(doc, LocatedDict) and isinstance(doc["list"], LocatedList)
    assert doc.line_of("list") == 2
    assert doc["list"].line_of(1) == 4
    assert doc["list"][1].line_of("k") == 4


@pytest.mark.parametrize(
    ("text", "message"),
    [("a: [1\n", "invalid YAML"), ("a: 1\na: 2\n", "duplicate key 'a'")],
)
def test_yaml_syntax_problems_are_config_errors_with_a_line(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        loads_yaml(text, source="x.yaml")
    assert message in str(info.value)
    assert info.value.line is not None and str(info.value).startswith("x.yaml:")
