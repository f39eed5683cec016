"""Projected-style workload tokens for tests: a test issuer key stands in for the API server's.

No Kubernetes API server runs here. :class:`TokenIssuer` holds an ES256 key
and mints JWTs with the claims of a projected service-account token
(``iss``, ``aud: ["meshplane"]``, ``sub: system:serviceaccount:NS:SA``, the
``kubernetes.io`` claim with the namespace, the pod and the service
account, ``iat``/``nbf``/``exp``), the shape
:func:`meshplane.workload_contract.claims_of` reads; :meth:`TokenIssuer.jwks`
is the public half that the cluster's admin registers
(``cluster.workloadIdentity.issuers``).
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import ec
from jwt.algorithms import ECAlgorithm

from meshplane.workload_contract import TOKEN_AUDIENCE


class TokenIssuer:
    """One issuer: its URL, its key id and its private key (test-only)."""

    def __init__(self, issuer: str = "https://issuer.test.meshplane", kid: str | None = None):
        self.issuer = issuer
        self.kid = kid or uuid.uuid4().hex[:12]
        self.key = ec.generate_private_key(ec.SECP256R1())

    def jwks(self) -> dict[str, Any]:
        """The public JWKS (no private member)."""
        jwk = json.loads(ECAlgorithm.to_jwk(self.key.public_key()))
        return {"keys": [jwk | {"kid": self.kid, "use": "sig", "alg": "ES256"}]}

    def registration(self) -> dict[str, Any]:
        """An entry of ``cluster.workloadIdentity.issuers``."""
        return {"issuer": self.issuer, "jwks": self.jwks()}

    def claims(
        self,
        namespace: str,
        account: str,
        pod: str,
        uid: str,
        *,
        ttl: float = 3600,
        now: float | None = None,
        audience: list[str] | None = None,
    ) -> dict[str, Any]:
        issued = int(time.time() if now is None else now)
        return {
            "iss": self.issuer,
            "aud": audience if audience is not None else [TOKEN_AUDIENCE],
            "sub": f"system:serviceaccount:{namespace}:{account}",
            "iat": issued,
            "nbf": issued,
            "exp": int(issued + ttl),
            "kubernetes.io": {
                "namespace": namespace,
                "pod": {"name": pod, "uid": uid},
                "serviceaccount": {"name": account, "uid": f"sa-{namespace}-{account}"},
            },
        }

    def sign(self, claims: dict[str, Any]) -> str:
        return jwt.encode(claims, self.key, algorithm="ES256", headers={"kid": self.kid})

    def mint(self, namespace: str, account: str, pod: str, uid: str, **kw: Any) -> str:
        """A token for pod ``namespace/pod`` (uid ``uid``) of service account ``account``."""
        return self.sign(self.claims(namespace, account, pod, uid, **kw))

    def write(
        self, path: Path, namespace: str, account: str, pod: str, uid: str, **kw: Any
    ) -> Path:
        """Write a token file as the kubelet does: a new file renamed over the old one."""
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(path.name + ".tmp")
        partial.write_text(self.mint(namespace, account, pod, uid, **kw), encoding="ascii")
        partial.replace(path)
        return path
