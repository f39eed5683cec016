"""Who a workload is: its token verified against its cluster's issuers and pod inventory (pure).

A sidecar (through its pod-local agent) proves its identity with its pod's
projected service-account token (:mod:`meshplane.workload_contract`). This
module decides, with the clock passed in, whether such a token names a live
pod of ONE cluster, and what may be done in its name:

- :func:`verify`: the token is a JWT signed (RS256 or ES256; never ``none``
  or an HMAC, whose key a verifier would have to share) by a key of one of
  the cluster's issuers (the one its agent reports, and the ones its admin
  registered), its ``aud`` holds :data:`~meshplane.workload_contract.TOKEN_AUDIENCE`,
  ``exp`` and ``nbf`` bracket now (:data:`SKEW` either way), its claims name
  a pod (:func:`~meshplane.workload_contract.claims_of`), and that pod is in
  the cluster's last inventory with the same uid (and service account, when
  reported). Two clusters may share an issuer URL (Kubernetes' default), not
  its keys: the key decides, and the pod must be THIS cluster's;
- :func:`check_csr`: a CSR asks for exactly the verified identity, with a
  P-256 key (:class:`SeenKeys` refuses a key presented before);
- :func:`sidecar_refusal`: what a sidecar's node metadata announces
  (namespace, service account, service, inbound address) is the verified
  pod's.

Every refusal is an :class:`AttestationError` with a bounded ``reason``
(a metric label) and a message that names the claim, never the token.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import json
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import jwt
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from agent.contract import MAX_JWKS_BYTES
from meshplane import workload_contract
from meshplane.jwk import PRIVATE_MEMBERS
from meshplane.sidecar_contract import SidecarNode, spiffe_id
from meshplane.workload_contract import WorkloadClaims, WorkloadTokenError

#: Clock skew allowed on ``exp``, ``nbf`` and ``iat`` (seconds).
SKEW = 60.0
#: Signature algorithms a workload token may use (asymmetric only).
ALGORITHMS = ("RS256", "ES256")
#: Largest token accepted (projected tokens are ~1 KiB).
MAX_TOKEN_BYTES = 8192
#: Largest CSR accepted, PEM.
MAX_CSR_BYTES = 8192
#: Issuers a cluster may have registered by its admin; a JWKS's size; keys per JWKS.
MAX_ISSUERS = 8
MAX_JWKS_KEYS = 16
MAX_ISSUER_URL = 512
#: Smallest RSA key a registered issuer may use.
MIN_RSA_BITS = 2048
#: SPKI digests remembered per replica (16 bytes each, ~100 B with the table: ~10 MiB).
MAX_SEEN_KEYS = 100_000


class AttestationError(Exception):
    """A refusal: ``reason`` is a bounded label, the message says what failed."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Issuer:
    """A service-account issuer: its ``iss`` URL and its public JWKs."""

    issuer: str
    keys: tuple[Mapping[str, Any], ...]


@dataclass(frozen=True)
class Pod:
    """One pod of the cluster's last inventory."""

    namespace: str
    name: str
    uid: str
    ip: str = ""
    service_account: str = ""  # "" when the agent did not report it
    services: frozenset[str] = frozenset()


@dataclass(frozen=True)
class ClusterTrust:
    """What a cluster's workload tokens are verified against."""

    issuers: tuple[Issuer, ...] = ()
    pods: Mapping[tuple[str, str], Pod] = field(default_factory=dict)  # (ns, name) → pod


@dataclass(frozen=True)
class Attested:
    """A verified workload: its token's claims and its pod in the inventory."""

    claims: WorkloadClaims
    pod: Pod

    @property
    def grant(self) -> str:
        """What an admitted stream re-checks on every wake (see :func:`still_there`)."""
        return f"{self.pod.namespace}/{self.pod.name}/{self.pod.uid}"

    def spiffe_id(self, trust_domain: str) -> str:
        return spiffe_id(trust_domain, self.claims.namespace, self.claims.service_account)


# ---- the cluster's trust, from what is stored ---------------------------------


def jwks_problem(value: object) -> str | None:
    """Why ``value`` is not a public JWKS within the caps, or None."""
    if not isinstance(value, Mapping) or not isinstance(value.get("keys"), list):
        return 'must be {"keys": [JWK, ...]}'
    keys = value["keys"]
    if not keys or len(keys) > MAX_JWKS_KEYS:
        return f"must hold 1 to {MAX_JWKS_KEYS} keys"
    if len(json.dumps(value, separators=(",", ":"))) > MAX_JWKS_BYTES:
        return f"must be at most {MAX_JWKS_BYTES} bytes"
    for i, key in enumerate(keys):
        if not isinstance(key, Mapping) or key.get("kty") not in ("RSA", "EC"):
            return f"keys[{i}] must be an RSA or EC public JWK"
        private = sorted(PRIVATE_MEMBERS & set(key))
        if private:
            return f"keys[{i}] holds private members {private}: give public keys only"
        problem = _key_problem(key)
        if problem is not None:
            return f"keys[{i}] {problem}"
    return None


def _key_problem(key: Mapping[str, Any]) -> str | None:
    """Why a public JWK cannot verify RS256 (RSA, 2048 bits or more) or ES256 (P-256)."""
    if key["kty"] == "EC" and key.get("crv") != "P-256":
        return "must be on curve P-256 (ES256)"
    try:
        loaded = jwt.PyJWK(dict(key), "RS256" if key["kty"] == "RSA" else "ES256").key
    except (jwt.PyJWTError, ValueError, TypeError) as exc:
        return f"is not a usable key: {exc}"
    if isinstance(loaded, rsa.RSAPublicKey) and loaded.key_size < MIN_RSA_BITS:
        return f"must be an RSA key of at least {MIN_RSA_BITS} bits"
    return None


def issuer_problem(value: object) -> tuple[str, str] | None:
    """(the member at fault, "" for the whole; why) when ``value`` is not
    ``{issuer, jwks}`` (see :func:`jwks_problem`), or None."""
    if not isinstance(value, Mapping):
        return "", 'must be {"issuer": URL, "jwks": {"keys": [...]}}'
    url = value.get("issuer")
    if not isinstance(url, str) or not url or len(url) > MAX_ISSUER_URL:
        return "issuer", f"must be a URL of 1 to {MAX_ISSUER_URL} characters"
    problem = jwks_problem(value.get("jwks"))
    return None if problem is None else ("jwks", problem)


def _issuer(value: object) -> Issuer | None:
    if issuer_problem(value) is not None:
        return None
    assert isinstance(value, Mapping)
    return Issuer(str(value["issuer"]), tuple(value["jwks"]["keys"]))


def trust_of(status: Mapping[str, Any], spec: Mapping[str, Any]) -> ClusterTrust:
    """A cluster's :class:`ClusterTrust` from its stored status (the agent's last
    report) and spec (``workloadIdentity.issuers``). Entries that do not validate
    are skipped: they were validated on write, so this is only a guard."""
    reported = (status.get("state") or {}).get("serviceAccountIssuer")
    registered = (spec.get("workloadIdentity") or {}).get("issuers") or []
    issuers = [i for i in (_issuer(v) for v in [reported, *registered]) if i is not None]
    pods: dict[tuple[str, str], Pod] = {}
    for ns in status.get("namespaces") or []:
        for item in ns.get("pods") or []:
            pod = Pod(
                namespace=str(ns["name"]),
                name=str(item.get("name", "")),
                uid=str(item.get("uid", "")),
                ip=str(item.get("ip") or ""),
                service_account=str(item.get("serviceAccount") or ""),
                services=frozenset(str(s) for s in item.get("services") or []),
            )
            pods[(pod.namespace, pod.name)] = pod
    return ClusterTrust(tuple(issuers), pods)


# ---- the token ---------------------------------------------------------------


def _segment(part: str) -> dict[str, Any]:
    padded = part + "=" * (-len(part) % 4)
    value = json.loads(base64.urlsafe_b64decode(padded.encode("ascii")))
    if not isinstance(value, dict):
        raise ValueError("not a JSON object")
    return value


def _unverified(token: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The header and payload of a compact JWS, not yet verified."""
    if len(token) > MAX_TOKEN_BYTES:
        raise AttestationError("malformed", f"the token is longer than {MAX_TOKEN_BYTES} bytes")
    parts = token.split(".")
    if len(parts) != 3:
        raise AttestationError("malformed", "the token is not a signed JWT")
    try:
        return _segment(parts[0]), _segment(parts[1])
    except (ValueError, UnicodeError):
        raise AttestationError("malformed", "the token is not a signed JWT") from None


def _candidates(trust: ClusterTrust, iss: str, kid: object) -> list[Mapping[str, Any]]:
    keys = [k for i in trust.issuers if i.issuer == iss for k in i.keys]
    if isinstance(kid, str) and kid:
        return [k for k in keys if k.get("kid") == kid]
    return keys


def _signed_by(token: str, alg: str, keys: Iterable[Mapping[str, Any]]) -> bool:
    for jwk in keys:
        try:
            key = jwt.PyJWK(dict(jwk), alg)
            jwt.decode(
                token,
                key.key,
                algorithms=[alg],
                # Times and audience are checked below against the clock passed in.
                options={
                    "verify_exp": False,
                    "verify_nbf": False,
                    "verify_iat": False,
                    "verify_aud": False,
                    "verify_iss": False,
                },
            )
        except (jwt.PyJWTError, ValueError, TypeError):
            continue
        return True
    return False


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _check_times(payload: Mapping[str, Any], now: float) -> None:
    exp = _number(payload.get("exp"))
    if exp is None:
        raise AttestationError("claims", "the token has no exp")
    if now > exp + SKEW:
        raise AttestationError("expired", "the token has expired")
    for claim in ("nbf", "iat"):
        value = _number(payload.get(claim))
        if value is not None and now + SKEW < value:
            raise AttestationError("not_yet_valid", f"the token's {claim} is in the future")


def _check_audience(payload: Mapping[str, Any]) -> None:
    aud = payload.get("aud")
    audiences = [aud] if isinstance(aud, str) else aud if isinstance(aud, list) else []
    if workload_contract.TOKEN_AUDIENCE not in audiences:
        raise AttestationError(
            "audience", f"the token's aud does not hold {workload_contract.TOKEN_AUDIENCE!r}"
        )


def verify(token: str, trust: ClusterTrust, now: float) -> Attested:
    """The workload ``token`` names, verified (see the module docstring)."""
    header, payload = _unverified(token)
    alg = header.get("alg")
    if alg not in ALGORITHMS:
        raise AttestationError("algorithm", f"the token's alg must be one of {ALGORITHMS}")
    iss = payload.get("iss")
    if not isinstance(iss, str) or not any(i.issuer == iss for i in trust.issuers):
        raise AttestationError("issuer", "the token's issuer is not one of the cluster's")
    if not _signed_by(token, str(alg), _candidates(trust, iss, header.get("kid"))):
        raise AttestationError("signature", "the token is not signed by a key of its issuer")
    _check_audience(payload)
    _check_times(payload, now)
    try:
        claims = workload_contract.claims_of(payload)
    except WorkloadTokenError as exc:
        raise AttestationError("claims", str(exc)) from None
    return Attested(
        claims, pod_of(trust, claims.namespace, claims.pod_name, claims.pod_uid, claims)
    )


def pod_of(
    trust: ClusterTrust, namespace: str, name: str, uid: str, claims: WorkloadClaims | None = None
) -> Pod:
    """The inventory's pod ``namespace/name`` if it still has ``uid`` (and, with
    ``claims``, the claimed service account when the inventory reports one)."""
    pod = trust.pods.get((namespace, name))
    if pod is None:
        raise AttestationError(
            "pod_unknown", f"pod {namespace}/{name} is not in the cluster's inventory"
        )
    if pod.uid != uid:
        raise AttestationError(
            "pod_uid", f"pod {namespace}/{name} has another uid (it was recreated)"
        )
    if claims is not None and pod.service_account and pod.service_account != claims.service_account:
        raise AttestationError(
            "service_account",
            f"pod {namespace}/{name} runs as {pod.service_account}, not {claims.service_account}",
        )
    return pod


def still_there(trust: ClusterTrust, grant: str) -> str | None:
    """None while the pod of an :attr:`Attested.grant` is in ``trust`` with its uid,
    else why not."""
    namespace, _, rest = grant.partition("/")
    name, _, uid = rest.partition("/")
    try:
        pod_of(trust, namespace, name, uid)
    except AttestationError as exc:
        return str(exc)
    return None


# ---- the CSR -----------------------------------------------------------------


def check_csr(csr_pem: str, expected: str) -> ec.EllipticCurvePublicKey:
    """The public key of ``csr_pem`` if it asks for exactly the SPIFFE id ``expected``.

    ``csr_invalid``: too long, not a PKCS#10 PEM, a bad signature, not P-256;
    ``csr_identity``: anything but one URI SAN equal to ``expected``.
    """
    if len(csr_pem) > MAX_CSR_BYTES:
        raise AttestationError("csr_invalid", f"the CSR is longer than {MAX_CSR_BYTES} bytes")
    try:
        csr = x509.load_pem_x509_csr(csr_pem.encode())
        valid = csr.is_signature_valid
        key = csr.public_key()
    except (ValueError, TypeError, UnicodeError):
        raise AttestationError("csr_invalid", "the CSR is not a PKCS#10 request in PEM") from None
    if not valid:
        raise AttestationError("csr_invalid", "the CSR's signature does not verify")
    if not isinstance(key, ec.EllipticCurvePublicKey) or not isinstance(key.curve, ec.SECP256R1):
        raise AttestationError("csr_invalid", "the CSR's key must be ECDSA P-256")
    try:
        sans = list(csr.extensions.get_extension_for_class(x509.SubjectAlternativeName).value)
    except (x509.ExtensionNotFound, ValueError):
        sans = []
    uris = [n.value for n in sans if isinstance(n, x509.UniformResourceIdentifier)]
    if len(sans) != 1 or uris != [expected]:
        raise AttestationError(
            "csr_identity", f"the CSR must carry exactly one URI SAN, {expected}"
        )
    return key


def key_digest(key: ec.EllipticCurvePublicKey) -> bytes:
    """The first 16 bytes of the SHA-256 of a key's SubjectPublicKeyInfo."""
    spki = key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return hashlib.sha256(spki).digest()[:16]


class SeenKeys:
    """The keys this replica has signed, oldest forgotten past :data:`MAX_SEEN_KEYS`.

    A key is fresh for one certificate: a workload re-keys on every renewal,
    so a key presented again is a copy (of a leaked CSR, or a replay).
    """

    def __init__(self, limit: int = MAX_SEEN_KEYS) -> None:
        self._limit = limit
        self._lock = threading.Lock()
        self._seen: OrderedDict[bytes, None] = OrderedDict()

    def claim(self, digest: bytes) -> bool:
        """True (and remembered) the first time ``digest`` is presented."""
        with self._lock:
            if digest in self._seen:
                return False
            self._seen[digest] = None
            while len(self._seen) > self._limit:
                self._seen.popitem(last=False)
            return True


# ---- the sidecar's node ------------------------------------------------------


def _loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def sidecar_refusal(attested: Attested, node: SidecarNode) -> AttestationError | None:
    """Why ``node`` may not stand for ``attested``'s pod, or None.

    Namespace and service account are the token's; the service one the pod
    is in; the inbound address the pod's IP (a loopback address only when
    the inventory reports the pod's IP as loopback: the local and static modes).
    """
    claims, pod = attested.claims, attested.pod
    if (node.namespace, node.service_account) != (claims.namespace, claims.service_account):
        return AttestationError(
            "identity",
            f"the node announces {node.namespace}/{node.service_account}, "
            f"its token is {claims.namespace}/{claims.service_account}",
        )
    if node.service not in pod.services:
        return AttestationError(
            "service",
            f"pod {pod.namespace}/{pod.name} is not in service {node.service}",
        )
    if node.inbound_host != pod.ip and not (_loopback(node.inbound_host) and _loopback(pod.ip)):
        return AttestationError(
            "address",
            f"the inbound address {node.inbound_host} is not pod {pod.namespace}/{pod.name}'s",
        )
    return None
