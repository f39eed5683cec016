"""Every test table runs on every backend the runtime has.

The tables take their backends from ``tests.support.backends.BACKENDS``
(derived from ``meshplane.server_contract.SERVER_KINDS``); this fails when a
table's list drifts from it, or when a test module lists backends of its own.
"""

from __future__ import annotations

import re
from pathlib import Path

from meshplane.server_contract import SERVER_KINDS
from tests.ratelimit import servers as ratelimit_servers
from tests.runtime import supervisors
from tests.support.backends import BACKENDS

TESTS = Path(__file__).resolve().parents[1]
#: A literal list or tuple of two or more backend names: a table with its own matrix.
_NAME = "[\"'](?:" + "|".join(map(re.escape, SERVER_KINDS)) + ")[\"']"
OWN_LIST = re.compile(r"[\[(]\s*(" + _NAME + r"\s*,\s*)+" + _NAME)


def test_the_matrix_is_every_backend() -> None:
    assert tuple(SERVER_KINDS) == BACKENDS
    assert supervisors.SERVERS == BACKENDS
    assert ratelimit_servers.SERVERS == BACKENDS


def test_no_table_lists_backends_of_its_own() -> None:
    own = [
        f"{path.relative_to(TESTS)}: {match.group(0)}"
        for path in sorted(TESTS.rglob("*.py"))
        for match in OWN_LIST.finditer(path.read_text())
    ]
    assert not own, "use tests.support.backends.BACKENDS instead:\n" + "\n".join(own)
