"""Write a file that holds a secret (a key, a bootstrap with a token) readable by its owner only.

The file is created mode 0600 and, when it already existed with wider
permissions, narrowed with ``fchmod`` before the secret is written, so there
is no moment at which another user can read it. Shared by meshctl and the
demo so neither writes a credential through a plain ``open``.
"""

from __future__ import annotations

import os
from pathlib import Path


def write_secret(path: Path | str, text: str) -> None:
    """Replace ``path``'s content with ``text``, mode 0600."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
