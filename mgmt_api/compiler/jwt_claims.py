"""A rate-limit client selector on verified JWT claims, and the Envoy action that reads one.

``clientSelectors[].jwtClaims: [{name: sub, type: Distinct}]`` gives every
value of the claim its own bucket; ``{name: org, type: Exact, value: acme}``
limits that value only. The value is never read from a header: ext_authz
publishes the claims after it verified the token, as dynamic metadata
(``extauthz.contract.CLAIMS_METADATA_NAMESPACE``, field
``CLAIMS_METADATA_KEY``), and the rate-limit filter, which runs after
ext_authz, reads it with Envoy's ``metadata`` action.

The action sets no ``default_value`` and ``skip_if_absent: false``: when the
claim is absent (no ext_authz on the route, a token without it, a value
ext_authz does not publish), Envoy sends no descriptor for the rule, so the
rule does not apply to that request. A default value would put every such
request into one shared bucket; ``skip_if_absent: true`` would send the
descriptor without the entry, a different (shorter) descriptor that
another rule's chain could match.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from extauthz.contract import (
    CLAIMS_METADATA_KEY,
    CLAIMS_METADATA_NAMESPACE,
    MAX_CLAIM_NAME_CHARS,
    MAX_CLAIM_VALUE_BYTES,
)

#: A claim name: visible ASCII, as ext_authz's loader requires.
CLAIM_NAME_PATTERN = r"^[!-~]+$"


class ClaimMatchType(StrEnum):
    EXACT = "Exact"
    DISTINCT = "Distinct"


class JwtClaimMatch(BaseModel):
    """One claim a client selector matches on."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    name: str = Field(min_length=1, max_length=MAX_CLAIM_NAME_CHARS, pattern=CLAIM_NAME_PATTERN)
    type: ClaimMatchType = ClaimMatchType.EXACT
    value: str | None = Field(default=None, min_length=1)

    @model_validator(mode="after")
    def _value_rules(self) -> JwtClaimMatch:
        if self.type is ClaimMatchType.DISTINCT:
            if self.value is not None:
                raise ValueError("value must be empty when type is Distinct")
        elif self.value is None:
            raise ValueError("value is required when type is Exact")
        elif len(self.value.encode()) > MAX_CLAIM_VALUE_BYTES:
            # ext_authz publishes a longer value as its digest, which no
            # Exact value could equal: the rule would never apply.
            raise ValueError(f"value is longer than {MAX_CLAIM_VALUE_BYTES} bytes in UTF-8")
        return self


def claim_action(descriptor_key: str, claim: str) -> dict[str, Any]:
    """Envoy's ``RateLimit.Action.MetaData`` (protojson) reading a published claim."""
    return {
        "metadata": {
            "descriptorKey": descriptor_key,
            "metadataKey": {
                "key": CLAIMS_METADATA_NAMESPACE,
                "path": [{"key": CLAIMS_METADATA_KEY}, {"key": claim}],
            },
            "source": "DYNAMIC",
            "skipIfAbsent": False,
        }
    }
