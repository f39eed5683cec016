"""One fleet (mgmt-api, three Envoys, an agent) for every end-to-end test of the agent."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.agent.fleet import Fleet


@pytest.fixture(scope="package")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    fleet = Fleet(Path(tmp_path_factory.mktemp("fleet")))
    try:
        yield fleet
    finally:
        fleet.close()
