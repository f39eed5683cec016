"""The operations of the served OpenAPI document, and requests that reach each one.

Tests that must hold for every operation (authentication first, strict
boolean flags) iterate the document the server publishes, so a route added
later is covered without being listed anywhere.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx

from tests.mgmt_api.harness import ok

_PARAM = re.compile(r"{(\w+)}")


@dataclass(frozen=True)
class Operation:
    method: str
    template: str
    spec: dict[str, Any]

    @property
    def public(self) -> bool:
        """Served without credentials: the document gives it no security requirement."""
        return "security" not in self.spec

    @property
    def has_body(self) -> bool:
        return "requestBody" in self.spec

    def parameters(self, where: str) -> list[dict[str, Any]]:
        return [p for p in self.spec.get("parameters", []) if p["in"] == where]

    def path(self) -> str:
        """The template with a well-formed name in each path parameter (no object need exist)."""
        schemas = {p["name"]: p["schema"] for p in self.parameters("path")}

        def name(match: re.Match[str]) -> str:
            pattern = schemas[match.group(1)].get("pattern", "")
            return "absent.name" if r"\." in pattern else "absent"

        return _PARAM.sub(name, self.template)

    def __str__(self) -> str:
        return f"{self.method.upper()} {self.template}"


def operations(client: httpx.Client) -> Iterator[Operation]:
    """Every operation of ``/v2/openapi.json`` (``client`` has credentials to read it)."""
    spec = ok(client.get("/v2/openapi.json"))
    for template, ops in spec["paths"].items():
        for method, op in ops.items():
            yield Operation(method, template, op)
