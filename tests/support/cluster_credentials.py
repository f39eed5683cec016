"""Each cluster component's credentials file, from a cluster's install template.

The template carries one key per account of the cluster
(:data:`mgmt_api.domain.cluster_accounts.ACCOUNTS`); a component is started
with its own (``--credentials``), as the chart and the demo do.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from meshplane.control_plane import ServiceAccountKey
from mgmt_api.auth.keys import PrivateJwk
from mgmt_api.domain import cluster_accounts

_ENTRIES = {a.name: a.template_secret for a in cluster_accounts.ACCOUNTS}


def credential(created: dict[str, Any], component: str) -> dict[str, Any]:
    """``component``'s key entry of a create (or ``includeInstallTemplate``) answer."""
    template = created.get("installTemplate", created)
    entry: dict[str, Any] = template["helm"]["secrets"][_ENTRIES[component]]
    return entry


def write_credential(created: dict[str, Any], component: str, path: Path) -> Path:
    """Write ``component``'s key entry to ``path`` (what ``--credentials`` reads)."""
    path.write_text(json.dumps(credential(created, component)))
    return path


def private_jwk(key: ServiceAccountKey) -> PrivateJwk:
    """A loaded credential's key as mgmt_api's signer takes it (meshplane's loader, which
    may not import mgmt_api, keeps it as the file's JSON object); a missing field fails."""
    jwk = key.private_jwk
    return {
        "kty": jwk["kty"],
        "crv": jwk["crv"],
        "x": jwk["x"],
        "y": jwk["y"],
        "d": jwk["d"],
        "kid": jwk["kid"],
        "alg": jwk["alg"],
        "use": jwk["use"],
    }
