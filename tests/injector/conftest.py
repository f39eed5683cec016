from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.injector.support import Injector
from tests.support.certs import CertificateAuthority


@pytest.fixture(scope="module")
def injector(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Injector]:
    """One injector subprocess over real HTTPS for a module's tests (it starts in ~1 s)."""
    tmp: Path = tmp_path_factory.mktemp("injector")
    ca = CertificateAuthority(tmp)
    running = Injector(tmp, ca, ca.issue("injector.meshplane-system.svc"))
    running.service.start()
    yield running
    running.service.stop()
