"""What other components may know of ext_authz: its snapshot contract.

The management plane compiles ExtAuthzPolicies into the file this service
loads, and Envoy selects a policy per route with a context extension. Those
names, and the one validator of that file, are the whole surface other
packages may import (an import-linter contract in ``pyproject.toml``
enforces it), so the service's internals can change without them noticing.
"""

from __future__ import annotations

from extauthz.claim_metadata import KEY as CLAIMS_METADATA_KEY
from extauthz.claim_metadata import MAX_CLAIMS as MAX_METADATA_CLAIMS
from extauthz.claim_metadata import MAX_NAME_CHARS as MAX_CLAIM_NAME_CHARS
from extauthz.claim_metadata import MAX_VALUE_BYTES as MAX_CLAIM_VALUE_BYTES
from extauthz.claim_metadata import NAMESPACE as CLAIMS_METADATA_NAMESPACE
from extauthz.config import POLICY_CONTEXT_KEY, ExtAuthzConfig
from extauthz.config import parse_config as _parse_config
from extauthz.reasons import RULES as _RULES
from extauthz.responses import REASON_HEADER

__all__ = [
    "CLAIMS_METADATA_KEY",
    "CLAIMS_METADATA_NAMESPACE",
    "FILE_NAME",
    "MAX_CLAIM_NAME_CHARS",
    "MAX_CLAIM_VALUE_BYTES",
    "MAX_METADATA_CLAIMS",
    "POLICY_CONTEXT_KEY",
    "REASON_HEADER",
    "REASON_RULES",
    "ExtAuthzConfig",
    "parse_config",
]

#: Reason code -> the part of the policy it comes from (a decision line's ``rule``),
#: for the policy's check inside Envoy, whose lines must read as the service's.
REASON_RULES: dict[str, str] = {reason.value: rule for reason, rule in _RULES.items()}

#: The one file of an ext_authz snapshot (``extauthz serve --config DIR``).
FILE_NAME = "extauthz.yaml"


def parse_config(document: bytes | str, source: str = FILE_NAME) -> ExtAuthzConfig:
    """Validate an ext_authz config document exactly as the service loads it.

    Raises :class:`meshplane.config_error.ConfigError` naming the line and the
    field; never touches the filesystem for the document itself.
    """
    text = document.decode("utf-8") if isinstance(document, bytes) else document
    return _parse_config(text, source)
