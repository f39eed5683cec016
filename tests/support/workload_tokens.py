"""A test service-account issuer: projected-style workload tokens signed with a test key.

No Kubernetes API server runs here; this stands in for the issuer's signing
key (what the kubelet's projected token would carry), with the same claim
shape: ``iss``, ``sub`` ``system:serviceaccount:NS:SA``, ``aud``, ``exp``,
``iat``, ``nbf`` and the ``kubernetes.io`` claim naming the namespace, the pod
and the service account.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import jwt
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from meshplane.proto.workload.v1 import workload_pb2 as pb
from meshplane.proto.workload.v1 import workload_pb2_grpc as pb_grpc
from meshplane.sidecar_contract import spiffe_id
from meshplane.workload_contract import TOKEN_AUDIENCE


@dataclass(frozen=True)
class PodRef:
    namespace: str
    name: str
    service_account: str = "default"
    uid: str = field(default_factory=lambda: str(uuid.uuid4()))
    ip: str = "127.0.0.1"
    services: tuple[str, ...] = ()

    def report(self) -> dict[str, Any]:
        """The pod as an inventory report lists it (under its namespace)."""
        return {
            "name": self.name,
            "uid": self.uid,
            "ip": self.ip,
            "serviceAccount": self.service_account,
            "services": list(self.services),
        }


class TestIssuer:
    """An issuer URL and its signing key (ES256 by default, RS256 with ``rsa=True``)."""

    __test__ = False  # not a pytest class

    def __init__(self, issuer: str = "https://kubernetes.test", *, rsa_key: bool = False) -> None:
        self.issuer = issuer
        self.kid = uuid.uuid4().hex[:16]
        self.alg = "RS256" if rsa_key else "ES256"
        self._key: Any = (
            rsa.generate_private_key(public_exponent=65537, key_size=2048)
            if rsa_key
            else ec.generate_private_key(ec.SECP256R1())
        )

    def jwks(self) -> dict[str, Any]:
        algorithm = jwt.get_algorithm_by_name(self.alg)
        public = json.loads(algorithm.to_jwk(self._key.public_key()))
        return {"keys": [{**public, "kid": self.kid, "use": "sig", "alg": self.alg}]}

    def registration(self) -> dict[str, Any]:
        """``{issuer, jwks}``: as an agent reports it, or an admin registers it."""
        return {"issuer": self.issuer, "jwks": self.jwks()}

    def token(
        self,
        pod: PodRef,
        *,
        now: float | None = None,
        ttl: float = 3600,
        audience: str | list[str] = TOKEN_AUDIENCE,
        alg: str | None = None,
        **overrides: Any,
    ) -> str:
        """A projected-style token for ``pod``; ``overrides`` replace claims (None drops one)."""
        now = time.time() if now is None else now
        claims: dict[str, Any] = {
            "iss": self.issuer,
            "sub": f"system:serviceaccount:{pod.namespace}:{pod.service_account}",
            "aud": audience,
            "iat": int(now),
            "nbf": int(now),
            "exp": int(now + ttl),
            "kubernetes.io": {
                "namespace": pod.namespace,
                "pod": {"name": pod.name, "uid": pod.uid},
                "serviceaccount": {"name": pod.service_account, "uid": str(uuid.uuid4())},
            },
        }
        for name, value in overrides.items():
            if value is None:
                claims.pop(name, None)
            else:
                claims[name] = value
        return jwt.encode(claims, self._key, algorithm=alg or self.alg, headers={"kid": self.kid})

    def write(self, path: Path, pod: PodRef, **kw: Any) -> Path:
        """Write ``pod``'s token file as the kubelet does: a new file renamed over the old."""
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(path.name + ".tmp")
        partial.write_text(self.token(pod, **kw), encoding="ascii")
        partial.replace(path)
        return path


def kubernetes_io(claim: dict[str, Any]) -> dict[str, Any]:
    """``claim`` as the ``kubernetes.io`` override of :meth:`TestIssuer.token`
    (``token(pod, **kubernetes_io({...}))``): its name is no Python identifier."""
    return {"kubernetes.io": claim}


def csr_pem(*uris: str, key: ec.EllipticCurvePrivateKey | None = None) -> str:
    """A PKCS#10 CSR in PEM with these URI SANs (a new P-256 key unless given)."""
    key = key or ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = [x509.UniformResourceIdentifier(u) for u in uris]
    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([]))
        .add_extension(x509.SubjectAlternativeName(names), critical=True)
        .sign(key, hashes.SHA256())
    )
    return csr.public_bytes(serialization.Encoding.PEM).decode()


def sign(
    grpc_port: int, org: str, cluster: str, token: str, namespace: str, account: str
) -> pb.SignResponse:
    """``WorkloadCertificates/Sign`` on mgmt-api for the cluster's default trust domain."""
    identity = spiffe_id(f"{cluster}.{org}.mesh.local", namespace, account)
    with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        stub = pb_grpc.WorkloadCertificatesStub(channel)  # type: ignore[no-untyped-call]
        request = pb.SignRequest(csr_pem=csr_pem(identity), cluster=f"{org}/{cluster}")
        answer: pb.SignResponse = stub.Sign(
            request, metadata=(("authorization", f"Bearer {token}"),), timeout=10
        )
        return answer
