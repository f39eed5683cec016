"""Profile: default and mandatory settings attached to organizations, tenants, workspaces.

``defaults`` may be overridden by later profiles or the object's own value;
``mandates`` never are (:mod:`mgmt_api.domain.blame`). Both are free-form, and
every reader of the objects they reach sees them (blame, the cluster's
config), so they may hold no secret: a URL with a password or a private key
is refused (a cluster names its Redis password with ``urlRef``, a Secret).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

from pydantic import Field

from meshplane.kinds_contract import Kind
from mgmt_api.errors import invalid
from mgmt_api.kinds.base import Behaviour, KindDef, Write
from mgmt_api.schemas.resources import Meta


class Profile(Meta):
    deletion_protection_enabled: bool | None = None
    defaults: dict[str, Any] | None = Field(default=None, description="Overridable settings.")
    mandates: dict[str, Any] | None = Field(default=None, description="Enforced settings.")


def _strings(value: Any, path: str) -> Iterator[tuple[str, str]]:
    """``(field, text)`` of every string in a free-form value, lists included."""
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _strings(item, f"{path}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _strings(item, f"{path}[{i}]")


def _holds_secret(text: str) -> bool:
    if "PRIVATE KEY-----" in text:
        return True
    if "://" not in text or "@" not in text:
        return False
    try:
        return urlsplit(text.strip()).password is not None
    except ValueError:  # not a URL after all
        return False


class ProfileBehaviour(Behaviour):
    def validate(self, write: Write) -> None:
        for section in ("defaults", "mandates"):
            for field, text in _strings(write.spec.get(section), f"{write.prefix}.{section}"):
                if _holds_secret(text):
                    # Never quoted back: the value is the secret.
                    raise invalid(
                        field,
                        "holds a secret (a password in a URL, or a private key); profiles "
                        "are readable by everyone below them: reference a Secret instead "
                        "(rateLimit.backend.redis.urlRef)",
                    )


KIND = KindDef(Kind.PROFILE, Profile, behaviour=ProfileBehaviour(), protectable=True)
