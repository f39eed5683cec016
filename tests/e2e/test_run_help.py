"""``scripts/run --help`` answers from the orchestrator's parser without
running ``scripts/setup`` first (which always logs ``[setup] syncing the
locked environment``): the real script, in this checkout's environment."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_answers_without_the_setup(flag: str) -> None:
    done = subprocess.run(
        [str(REPO / "scripts" / "run"), "--state-dir", "unused", flag],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: ") and "--state-dir" in done.stdout
    assert "[setup]" not in done.stderr, done.stderr
    assert not (REPO / "unused").exists()
