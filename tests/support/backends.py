"""The server backends every test table runs on: one list, the runtime's own.

Every table that runs per backend (the wire, ShouldRateLimit and Check tables,
the runtime, flood and cap tables, UDS and TLS) takes its parameters from
:data:`BACKENDS`, derived from :data:`meshplane.server_contract.SERVER_KINDS`:
a backend added to the runtime runs every table at once, and
tests/runtime/test_backend_matrix.py fails on a table that lists its own.
"""

from __future__ import annotations

from meshplane.server_contract import SERVER_KINDS

BACKENDS: tuple[str, ...] = tuple(SERVER_KINDS)
