"""The workload's identity, key and certificate: pure decisions, the clock as an argument.

The agent never decides *who* the workload is: the namespace and service
account come from the pod's token (the management plane verifies it; here
the claims are only read, to build a CSR it will accept), and the SPIFFE id
in the CSR is what :func:`meshplane.sidecar_contract.spiffe_id` derives from
them. The private key is generated here, in memory, for each certificate
(a fresh key at every renewal: mgmt-api refuses a key it has seen), and is
turned into PEM only for the SDS answer that hands it to Envoy over the
pod-local socket.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass
from typing import Any

import jwt
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from meshplane.sidecar_contract import spiffe_id
from meshplane.workload_contract import WorkloadClaims, claims_of

#: A token file larger than this is no token (projected tokens are ~1 KiB).
MAX_TOKEN_BYTES = 16 * 1024
#: Renew when this share of the certificate's lifetime has passed.
RENEW_AT = 0.5


class TokenUnreadable(ValueError):
    """The token file holds no workload token (the message says why, never the token)."""


def token_claims(token: str) -> WorkloadClaims:
    """The claims of a workload token, read without verifying it.

    Only to derive the SPIFFE id a CSR asks for: mgmt-api verifies the token
    and refuses a CSR whose id is not the verified token's.
    """
    if len(token) > MAX_TOKEN_BYTES:
        raise TokenUnreadable(f"the token is larger than {MAX_TOKEN_BYTES} bytes")
    try:
        payload: dict[str, Any] = jwt.decode(token, options={"verify_signature": False})
    except jwt.PyJWTError:
        raise TokenUnreadable("the token is not a JWT") from None
    try:
        return claims_of(payload)
    except ValueError as exc:
        raise TokenUnreadable(str(exc)) from None


def workload_id(trust_domain: str, claims: WorkloadClaims) -> str:
    """The SPIFFE id the workload's certificate carries."""
    return spiffe_id(trust_domain, claims.namespace, claims.service_account)


def new_key() -> ec.EllipticCurvePrivateKey:
    """A fresh ECDSA P-256 key, in memory only."""
    return ec.generate_private_key(ec.SECP256R1())


def csr_pem(key: ec.EllipticCurvePrivateKey, identity: str) -> str:
    """A PKCS#10 request in PEM with exactly one URI SAN, ``identity``."""
    builder = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "meshplane")]))
        .add_extension(
            x509.SubjectAlternativeName([x509.UniformResourceIdentifier(identity)]),
            critical=True,
        )
    )
    return builder.sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM).decode()


def key_pem(key: ec.EllipticCurvePrivateKey) -> str:
    """The key as PKCS#8 PEM, for the SDS answer only (never written, never logged)."""
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()


def _timestamp(value: _dt.datetime) -> float:
    return value.replace(tzinfo=_dt.UTC).timestamp() if value.tzinfo is None else value.timestamp()


@dataclass(frozen=True)
class Issued:
    """One signed certificate and the trust bundle that came with it."""

    certificate_pem: str
    trust_bundle: tuple[str, ...]
    received: float
    not_after: float
    serial: int

    @classmethod
    def of(cls, certificate_pem: str, trust_bundle: tuple[str, ...], now: float) -> Issued:
        """The answer to a Sign call made at ``now``."""
        leaf = x509.load_pem_x509_certificate(certificate_pem.encode())
        return cls(
            certificate_pem,
            certificates_in("".join(trust_bundle)),
            max(now, _timestamp(leaf.not_valid_before_utc)),
            _timestamp(leaf.not_valid_after_utc),
            leaf.serial_number,
        )

    @property
    def renew_at(self) -> float:
        """When to sign a new key: half-way from receiving it to its expiry.

        Not from ``notBefore``: the mesh CA backdates it (peers' clock skew),
        which would put a short-lived certificate past its "half-life" at once.
        """
        return self.received + (self.not_after - self.received) * RENEW_AT

    def due(self, now: float) -> bool:
        return now >= self.renew_at

    def outdated_by(self, bundle: tuple[str, ...]) -> bool:
        """Whether a trust bundle (from :func:`certificates_in`) calls for a new certificate:
        its signing CA (the first) did not issue this one, or it is not the bundle this
        one was signed with (a CA rotation moved on: signing again tells mgmt-api this
        pod holds the new bundle)."""
        if not bundle:
            return False
        return bundle != self.trust_bundle or not self.signed_by(bundle[0])

    def signed_by(self, ca_pem: str) -> bool:
        """Whether ``ca_pem`` (a CA certificate) issued this certificate.

        A malformed CA counts as "not the issuer": the agent then asks for a
        new certificate, which is harmless.
        """
        try:
            ca = x509.load_pem_x509_certificate(ca_pem.encode())
            leaf = x509.load_pem_x509_certificate(self.certificate_pem.encode())
            leaf.verify_directly_issued_by(ca)
        except (ValueError, TypeError, InvalidSignature):
            return False
        return True


def trust_domain_of(ca_pem: str) -> str | None:
    """The trust domain a mesh CA certificate names (its URI SAN ``spiffe://TD``), or None.

    How the agent learns the cluster's effective trust domain without being
    told: mgmt-api sends the trust bundle over ADS before any certificate is
    needed, and its signing CA names the domain it signs for.
    """
    try:
        ca = x509.load_pem_x509_certificate(ca_pem.encode())
        sans = ca.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (ValueError, x509.ExtensionNotFound):
        return None
    for uri in sans.get_values_for_type(x509.UniformResourceIdentifier):
        domain = uri.removeprefix("spiffe://")
        if uri.startswith("spiffe://") and domain and "/" not in domain:
            return domain
    return None


_BEGIN, _END = "-----BEGIN CERTIFICATE-----", "-----END CERTIFICATE-----"
#: A trust bundle holds one CA, or two during a rotation; more is not read.
MAX_BUNDLE_CERTIFICATES = 8


def certificates_in(bundle_pem: str) -> tuple[str, ...]:
    """The PEM certificates of a concatenation, in order, each ending with one newline."""
    out: list[str] = []
    start = bundle_pem.find(_BEGIN)
    while start >= 0 and len(out) < MAX_BUNDLE_CERTIFICATES:
        end = bundle_pem.find(_END, start)
        if end < 0:
            break
        out.append(bundle_pem[start : end + len(_END)] + "\n")
        start = bundle_pem.find(_BEGIN, end)
    return tuple(out)
