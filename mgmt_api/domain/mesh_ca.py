"""A cluster's mesh CA and the workload certificates (X.509 SVIDs) it signs: pure X.509 building.

No store, no clock of its own: every function takes ``now`` (Unix seconds),
so the validity windows are table-tested (``tests/unit/test_mesh_ca.py``).
Keys are ECDSA P-256 (what Envoy and every TLS stack handle fastest, and
what SPIFFE's X.509-SVID profile lists first).

The shapes, after the SPIFFE X.509-SVID profile:

- the CA: self-signed, ``basicConstraints CA:TRUE, pathlen:0`` (it signs
  leaves only), ``keyCertSign``/``cRLSign``, its URI SAN the trust domain
  (``spiffe://TRUST_DOMAIN``); valid :data:`CA_LIFETIME`;
- an SVID: exactly one URI SAN ``spiffe://TRUST_DOMAIN/ns/NS/sa/SA`` (critical,
  the subject is empty), ``CA:FALSE``, ``digitalSignature`` only, extended key
  usage server and client auth (a sidecar is both). ``notBefore`` is
  :data:`BACKDATE` seconds in the past, so a peer whose clock is a little
  behind does not refuse a certificate issued a moment ago; ``notAfter``
  never outlives the CA.

Envoy's RBAC sees the URI SAN as ``principal.authenticated.principal_name``.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from meshplane import workload_contract

#: How long a cluster's CA is valid: ten years. It is replaced by a rotation
#: (:mod:`mgmt_api.domain.ca_rotation`), which an operator starts.
CA_LIFETIME = 10 * 365 * 86400
#: Default lifetime of a workload certificate (issue 24: short-lived, 24 h).
DEFAULT_SVID_TTL = 86400.0
#: Bounds of a configured lifetime: below 10 s rotation (at half-life, checked
#: every few seconds) would be constant churn; tests use 30 s. Above 30 days the
#: certificate is no longer short-lived.
MIN_SVID_TTL, MAX_SVID_TTL = 10.0, 30 * 86400.0
#: How far notBefore is set in the past (clock skew between peers).
BACKDATE = 60
#: Suffix of the trust domain a cluster without ``trustDomain`` gets.
DEFAULT_TRUST_DOMAIN_SUFFIX = workload_contract.DEFAULT_TRUST_DOMAIN_SUFFIX

# SPIFFE trust domain: lowercase letters, digits, '.', '-', '_' (SPIFFE-ID spec 2.1),
# here also at most 255 characters and not starting or ending with a dot.
_TRUST_DOMAIN = re.compile(r"^[a-z0-9_-]([a-z0-9._-]{0,253}[a-z0-9_-])?$")


class TrustDomainError(ValueError):
    """A trust domain SPIFFE refuses; the message says why."""


def validate_trust_domain(value: object) -> str:
    """``value`` if it is a SPIFFE trust domain, else :class:`TrustDomainError`."""
    if not isinstance(value, str) or not _TRUST_DOMAIN.match(value) or ".." in value:
        raise TrustDomainError(
            "must be a SPIFFE trust domain: 1-255 of a-z 0-9 . - _, "
            f"not starting or ending with a dot, not {value!r}"
        )
    return value


def default_trust_domain(organization: str, cluster: str) -> str:
    """The trust domain of a cluster whose spec names none: ``CLUSTER.ORG.mesh.local``.

    Organization and cluster names are DNS-1123 labels, so this is always a
    valid trust domain, and unique per cluster.
    """
    return validate_trust_domain(workload_contract.default_trust_domain(organization, cluster))


def trust_domain_of(organization: str, cluster: str, spec: Mapping[str, object]) -> str:
    """A cluster's own ``trustDomain`` (validated on write), else :func:`default_trust_domain`."""
    own = spec.get("trustDomain")
    if isinstance(own, str) and own:
        return own
    return default_trust_domain(organization, cluster)


def _time(seconds: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(int(seconds), dt.UTC)


@dataclass(frozen=True)
class CertificateAuthority:
    """A cluster's CA: its certificate and private key (the key never leaves mgmt-api).

    ``also_trusted``: the other CA certificate (PEM) workloads trust beside this
    one while a rotation overlaps them; empty outside a rotation.
    """

    trust_domain: str
    certificate: x509.Certificate
    key: ec.EllipticCurvePrivateKey
    also_trusted: tuple[str, ...] = ()

    @property
    def certificate_pem(self) -> str:
        return self.certificate.public_bytes(serialization.Encoding.PEM).decode()

    @property
    def trust_bundle(self) -> tuple[str, ...]:
        """The CA certificates (PEM) a workload trusts: this one first."""
        return (self.certificate_pem, *self.also_trusted)

    def key_pem(self) -> str:
        """The key, for the store only (docs/mesh.md: who can read it)."""
        return key_pem(self.key)

    @classmethod
    def load(cls, trust_domain: str, certificate_pem: str, key: str) -> CertificateAuthority:
        loaded = serialization.load_pem_private_key(key.encode(), password=None)
        if not isinstance(loaded, ec.EllipticCurvePrivateKey):
            raise ValueError("a mesh CA key is an ECDSA key")
        return cls(trust_domain, x509.load_pem_x509_certificate(certificate_pem.encode()), loaded)


def new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def key_pem(key: ec.EllipticCurvePrivateKey) -> str:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()


def new_ca(trust_domain: str, now: float, key: ec.EllipticCurvePrivateKey) -> CertificateAuthority:
    """A self-signed CA for ``trust_domain``, valid from ``now`` for :data:`CA_LIFETIME`."""
    validate_trust_domain(trust_domain)
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "meshplane"),
            x509.NameAttribute(NameOID.COMMON_NAME, f"mesh CA {trust_domain}"[:64]),
        ]
    )
    public = key.public_key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(_time(now - BACKDATE))
        .not_valid_after(_time(now + CA_LIFETIME))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.UniformResourceIdentifier(f"spiffe://{trust_domain}")]
            ),
            critical=False,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .sign(key, hashes.SHA256())
    )
    return CertificateAuthority(trust_domain, cert, key)


def issue_svid(
    ca: CertificateAuthority,
    identity: str,
    public_key: ec.EllipticCurvePublicKey,
    now: float,
    ttl: float = DEFAULT_SVID_TTL,
) -> x509.Certificate:
    """An X.509 SVID for ``identity`` (a SPIFFE id in ``ca``'s trust domain), valid ``ttl`` s."""
    if not identity.startswith(f"spiffe://{ca.trust_domain}/"):
        raise ValueError(f"{identity!r} is not in the trust domain {ca.trust_domain!r}")
    not_after = min(_time(now + ttl), ca.certificate.not_valid_after_utc)
    ca_ski = ca.certificate.extensions.get_extension_for_class(x509.SubjectKeyIdentifier)
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([]))
        .issuer_name(ca.certificate.subject)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(_time(now - BACKDATE))
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(
            x509.SubjectAlternativeName([x509.UniformResourceIdentifier(identity)]),
            critical=True,  # the subject is empty (RFC 5280 4.2.1.6)
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski.value),
            critical=False,
        )
        .sign(ca.key, hashes.SHA256())
    )


def rotation_due(certificate: x509.Certificate, now: float) -> bool:
    """Whether a certificate is past its half-life (from its real issue time, not notBefore).

    Rotating at half-life leaves the other half for retries if mgmt-api is
    away: a sidecar keeps serving with its certificate while it is valid.
    """
    not_before = certificate.not_valid_before_utc.timestamp() + BACKDATE
    not_after = certificate.not_valid_after_utc.timestamp()
    return now >= not_before + (not_after - not_before) / 2


def pem(certificate: x509.Certificate) -> str:
    return certificate.public_bytes(serialization.Encoding.PEM).decode()


def load_certificate(pem_text: str) -> x509.Certificate:
    return x509.load_pem_x509_certificate(pem_text.encode())


def serial(certificate: x509.Certificate) -> str:
    """The serial number in hex, as logs and signing records show it."""
    return f"{certificate.serial_number:x}"


def fingerprint(certificate: x509.Certificate) -> str:
    """``sha256:HEX`` of the certificate's DER (what ``openssl x509 -fingerprint`` shows)."""
    return "sha256:" + certificate.fingerprint(hashes.SHA256()).hex()


def store_prefix(cluster_fqn: str, create_time: int) -> str:
    """Where a cluster's CAs are stored (``server_kv``); a recreated cluster gets new ones."""
    digest = hashlib.sha256(f"{cluster_fqn}\0{create_time}".encode()).hexdigest()[:40]
    return f"mesh-ca/{digest}/"


def store_key(cluster_fqn: str, create_time: int, trust_domain: str) -> str:
    """The stored CA of one trust domain of a cluster (a changed trust domain: a new CA)."""
    return (
        store_prefix(cluster_fqn, create_time)
        + hashlib.sha256(trust_domain.encode()).hexdigest()[:20]
    )


#: Suffix of a CA's rotation state key (``store_key(...) + ROTATION_SUFFIX``).
ROTATION_SUFFIX = "/rotation"


def rotation_key(ca_key: str) -> str:
    """Where the rotation of the CA stored at ``ca_key`` is kept (under the cluster's prefix,
    so deleting the cluster deletes it)."""
    return ca_key + ROTATION_SUFFIX


def records_prefix(ca_key: str) -> str:
    """Where the signing records of the CA stored at ``ca_key`` are kept, one per instance."""
    return ca_key + "/signed/"


def record_key(ca_key: str, instance: str) -> str:
    return records_prefix(ca_key) + hashlib.sha256(instance.encode()).hexdigest()[:32]
