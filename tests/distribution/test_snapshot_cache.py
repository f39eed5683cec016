"""The subscriber's snapshot cache, as the workers and Prometheus see it.

- A snapshot whose version is already installed is never deleted and
  rewritten: ``current`` may point at it (the server re-sends the applied
  version after a NACK) and a worker may be loading it.
- A load resolves ``current`` once, so one load never mixes two snapshots.
- The subscriber's metrics land in the supervisor's multiprocess directory,
  with exactly one applied-version series.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest, multiprocess

from meshplane.config_source import FileSource, resolve_once
from meshplane.distribution_client import (
    SnapshotSubscriber,
    SubscriberMetrics,
    current_dir,
)
from meshplane.distribution_contract import NodeIdentity
from meshplane.proto.distribution.v1 import distribution_pb2 as pb
from ratelimit.app import load_snapshot

NODE = NodeIdentity("ratelimit", "acme", "east", "pod-1")
LIMITS = """domain: d
descriptors:
  - key: k
    value: v
    rate_limit: {unit: minute, requests_per_unit: %d}
"""


def _snapshot(version: str, requests: int = 3) -> pb.Snapshot:
    return pb.Snapshot(
        version_info=version,
        nonce="n",
        kind="ratelimit",
        files=[pb.ConfigFile(name="limits.yaml", content=(LIMITS % requests).encode())],
    )


def test_re_applying_the_applied_version_leaves_its_directory_in_place(tmp_path: Path) -> None:
    sub = SnapshotSubscriber("127.0.0.1:1", NODE, load_snapshot, tmp_path)
    assert sub.apply(_snapshot("v1")) is None
    live = Path(os.path.realpath(current_dir(tmp_path)))
    inode = (live / "limits.yaml").stat().st_ino
    # A worker holds the resolved directory open...
    held = resolve_once(current_dir(tmp_path))
    # ...while the server re-sends the applied version (after a NACK).
    assert sub.apply(_snapshot("v1")) is None
    assert (live / "limits.yaml").stat().st_ino == inode  # not deleted and rewritten
    assert held == live and load_snapshot(held).config is not None
    assert sub.applied_version == "v1"


def test_a_version_flipping_back_reuses_its_directory(tmp_path: Path) -> None:
    sub = SnapshotSubscriber("127.0.0.1:1", NODE, load_snapshot, tmp_path)
    assert sub.apply(_snapshot("v1", 3)) is None
    first = Path(os.path.realpath(current_dir(tmp_path)))
    inode = (first / "limits.yaml").stat().st_ino
    assert sub.apply(_snapshot("v2", 5)) is None
    assert sub.apply(_snapshot("v1", 3)) is None
    assert Path(os.path.realpath(current_dir(tmp_path))) == first
    assert (first / "limits.yaml").stat().st_ino == inode
    assert sub.applied_version == "v1"


def test_resolve_once_follows_the_current_link_only(tmp_path: Path) -> None:
    target = tmp_path / "snapshots" / "a"
    target.mkdir(parents=True)
    link = tmp_path / "current"
    link.symlink_to(Path("snapshots") / "a")
    assert resolve_once(link) == target.resolve()
    plain = tmp_path / "plain.yaml"
    plain.write_text("x: 1\n")
    file_link = tmp_path / "file-link.yaml"
    file_link.symlink_to(plain)
    assert resolve_once(file_link) == file_link  # a file (ConfigMap key): left as given
    assert resolve_once(tmp_path / "missing") == tmp_path / "missing"


async def test_workers_load_the_directory_current_pointed_at_when_the_load_began(
    tmp_path: Path,
) -> None:
    sub = SnapshotSubscriber("127.0.0.1:1", NODE, load_snapshot, tmp_path)
    seen: list[Path] = []

    def loader(path: Path) -> object:
        seen.append(path)
        return load_snapshot(path)

    source = FileSource(current_dir(tmp_path), loader, name="ratelimit")
    source.load_initial()
    assert sub.apply(_snapshot("v1")) is None
    assert await source.reload_if_changed() is True
    assert seen[-1] == Path(os.path.realpath(current_dir(tmp_path)))
    assert not seen[-1].is_symlink()


@pytest.fixture
def multiproc_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "metrics"
    directory.mkdir()
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(directory))
    return directory


def _scrape(directory: Path) -> str:
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=str(directory))  # type: ignore[no-untyped-call]
    return generate_latest(registry).decode()


def test_subscriber_metrics_reach_the_supervisors_scrape_with_one_version_series(
    multiproc_dir: Path,
) -> None:
    metrics = SubscriberMetrics("ratelimit")
    metrics.set(connected=True, version="v1")
    metrics.count("ack")
    text = _scrape(multiproc_dir)
    assert 'meshplane_distribution_applied_info{kind="ratelimit",version="v1"} 1.0' in text
    assert "meshplane_distribution_connected 1.0" in text
    assert 'meshplane_distribution_snapshots_total{result="ack"} 1.0' in text
    # Typed as a counter: HELP/TYPE name the samples' family, not "..._total_total".
    assert "# TYPE meshplane_distribution_snapshots_total counter" in text
    assert "_total_total" not in text
    metrics.set(version="v2")
    metrics.count("nack")
    metrics.set(connected=False)
    text = _scrape(multiproc_dir)
    assert text.count("meshplane_distribution_applied_info{") == 1  # v1's series is gone
    assert 'version="v2"' in text and 'version="v1"' not in text
    assert "meshplane_distribution_connected 0.0" in text
    assert 'meshplane_distribution_snapshots_total{result="nack"} 1.0' in text
    assert not list(multiproc_dir.glob(".*.tmp"))  # written atomically, nothing left over


def test_the_subscriber_reports_the_version_on_disk_at_start(
    tmp_path: Path, multiproc_dir: Path
) -> None:
    SnapshotSubscriber("127.0.0.1:1", NODE, load_snapshot, tmp_path / "c").apply(_snapshot("v9"))
    SnapshotSubscriber("127.0.0.1:1", NODE, load_snapshot, tmp_path / "c")  # a restart
    assert 'version="v9"' in _scrape(multiproc_dir)
