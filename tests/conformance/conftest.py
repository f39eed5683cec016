"""One echo supervisor per HTTP/2 backend, shared by every conformance test.

The backends are the matrix's (tests.support.backends.BACKENDS): these
tables hold meshplane's own HTTP/2 (``h2``) and the Envoy-fronted one
(``envoy``) to RFC 9113. Started
side by side once for the package (Envoy takes seconds to come up on a loaded
machine) and stopped with it.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.runtime.supervisors import Supervisor
from tests.support.backends import BACKENDS

#: The backends whose HTTP/2 these tables hold to RFC 9113.
HTTP2_BACKENDS: tuple[str, ...] = BACKENDS


@pytest.fixture(scope="package")
def servers() -> Iterator[dict[str, Supervisor]]:
    started: dict[str, Supervisor] = {}
    try:
        for kind in HTTP2_BACKENDS:
            started[kind] = Supervisor(kind, workers=1)
        for supervisor in started.values():
            supervisor.wait_serving()
        yield started
    finally:
        for supervisor in started.values():
            supervisor.close()
