"""Secrets stay off the screen (pure).

The install template carries the cluster agent's private key. The console
never renders it into a page (pages end up in screenshots, screen shares
and browser caches): it shows the template with every value under a
``secrets`` key replaced, and hands the real one over only as a download.
"""

from __future__ import annotations

from typing import Any

HIDDEN = "<hidden: use Download install template>"


def redact_secrets(value: Any, inside: bool = False) -> Any:
    """A copy of ``value`` with everything under a ``secrets`` key replaced."""
    if isinstance(value, dict):
        return {k: redact_secrets(v, inside or k == "secrets") for k, v in value.items()}
    if isinstance(value, list):
        return [redact_secrets(v, inside) for v in value]
    return HIDDEN if inside else value
