"""Where bytecode goes when the environment asks for none.

With ``PYTHONDONTWRITEBYTECODE`` set (as in some CI images and containers),
every interpreter compiles each module it imports from source at every
start: ``import mgmt_api.app`` costs about 3.5 CPU-seconds that way and 1.5
from a cache. A stack of a dozen interpreters (``scripts/run``) or a test
suite starting hundreds of them pays that again and again. Both write their
bytecode under the environment's own prefix instead (``.venv/pycache``,
through ``PYTHONPYCACHEPREFIX``, which children inherit), so the source tree
still gets no ``__pycache__``. A ``PYTHONPYCACHEPREFIX`` already set is kept.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path


def prefix() -> Path:
    """The environment's bytecode cache (inside the virtualenv, never the source tree)."""
    return Path(sys.prefix) / "pycache"


def cached(environ: Mapping[str, str]) -> dict[str, str] | None:
    """``environ`` with bytecode written under :func:`prefix`; None when nothing changes."""
    if not environ.get("PYTHONDONTWRITEBYTECODE") or environ.get("PYTHONPYCACHEPREFIX"):
        return None
    env = {k: v for k, v in environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(prefix())
    return env
