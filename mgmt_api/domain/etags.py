"""Etags: opaque, new on every write, derived from the global write revision.

The store bumps one revision counter per write transaction; hashing it with
the FQN gives a value that never repeats for an object (the counter only
grows) and does not reveal the write volume to clients.
"""

from __future__ import annotations

import hashlib


def compute(fqn: str, revision: int) -> str:
    digest = hashlib.blake2b(f"{fqn}\x00{revision}".encode(), digest_size=8).hexdigest()
    return f'"{digest}"'
