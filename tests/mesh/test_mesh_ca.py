"""The mesh CA and workload certificate builder (pure, clock injected): table tests."""

from __future__ import annotations

from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID

from meshplane.sidecar_contract import spiffe_id
from mgmt_api.domain import mesh_ca

NOW = 1_800_000_000.0  # an injected clock: 2027-01-15
TD = "c1.acme.mesh.local"
ID = spiffe_id(TD, "ns1", "sa-a")


@pytest.fixture(scope="module")
def ca() -> mesh_ca.CertificateAuthority:
    return mesh_ca.new_ca(TD, NOW, mesh_ca.new_key())


def _svid(ca: mesh_ca.CertificateAuthority, now: float = NOW, **kw: Any) -> x509.Certificate:
    return mesh_ca.issue_svid(ca, ID, mesh_ca.new_key().public_key(), now, **kw)


@pytest.mark.parametrize(
    ("ttl", "now", "not_before", "not_after"),
    [
        (86400.0, NOW, NOW - 60, NOW + 86400),  # the default lifetime, backdated a minute
        (30.0, NOW + 5, NOW - 55, NOW + 35),  # a test's short lifetime
        (mesh_ca.CA_LIFETIME * 2, NOW, NOW - 60, NOW + mesh_ca.CA_LIFETIME),  # never past the CA
    ],
)
def test_validity_window(
    ca: mesh_ca.CertificateAuthority, ttl: float, now: float, not_before: float, not_after: float
) -> None:
    cert = _svid(ca, now, ttl=ttl)
    assert cert.not_valid_before_utc.timestamp() == not_before
    assert cert.not_valid_after_utc.timestamp() == not_after


def test_a_workload_certificate_has_exactly_its_spiffe_id_and_leaf_usages(
    ca: mesh_ca.CertificateAuthority,
) -> None:
    cert = _svid(ca)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    assert san.critical and san.value.get_values_for_type(x509.UniformResourceIdentifier) == [ID]
    assert len(list(san.value)) == 1 and len(cert.subject) == 0
    basic = cert.extensions.get_extension_for_class(x509.BasicConstraints)
    assert basic.critical and basic.value.ca is False
    usage = cert.extensions.get_extension_for_class(x509.KeyUsage)
    assert usage.critical and usage.value.digital_signature
    assert not (usage.value.key_cert_sign or usage.value.key_encipherment)
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(eku) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    public_key = cert.public_key()
    assert isinstance(public_key, ec.EllipticCurvePublicKey)
    assert public_key.curve.name == "secp256r1"
    # Signed by the CA (raises when not).
    cert.verify_directly_issued_by(ca.certificate)
    other = mesh_ca.new_ca(TD, NOW, mesh_ca.new_key())
    with pytest.raises(Exception):  # noqa: B017 - cryptography's InvalidSignature
        cert.verify_directly_issued_by(other.certificate)


def test_the_ca_signs_leaves_only(ca: mesh_ca.CertificateAuthority) -> None:
    cert = ca.certificate
    basic = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    assert basic.ca and basic.path_length == 0
    usage = cert.extensions.get_extension_for_class(x509.KeyUsage).value
    assert usage.key_cert_sign and usage.crl_sign and not usage.digital_signature
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.UniformResourceIdentifier) == [f"spiffe://{TD}"]
    assert cert.not_valid_after_utc.timestamp() == NOW + mesh_ca.CA_LIFETIME
    again = mesh_ca.CertificateAuthority.load(TD, ca.certificate_pem, ca.key_pem())
    assert again.certificate == cert


def test_an_id_of_another_trust_domain_is_refused(ca: mesh_ca.CertificateAuthority) -> None:
    key = mesh_ca.new_key().public_key()
    with pytest.raises(ValueError, match="trust domain"):
        mesh_ca.issue_svid(ca, spiffe_id("other.mesh.local", "ns1", "sa-a"), key, NOW)


@pytest.mark.parametrize(
    ("elapsed", "due"),
    [(0, False), (14.9, False), (15, True), (29, True), (400, True)],
)
def test_rotation_is_due_at_half_life(
    ca: mesh_ca.CertificateAuthority, elapsed: float, due: bool
) -> None:
    cert = _svid(ca, ttl=30)
    assert mesh_ca.rotation_due(cert, NOW + elapsed) is due


@pytest.mark.parametrize(
    ("value", "valid"),
    [
        ("c1.acme.mesh.local", True),
        ("example.org", True),
        ("td_1-x", True),
        ("", False),
        ("Upper.example", False),
        (".lead.example", False),
        ("trail.example.", False),
        ("a..b", False),
        ("spiffe://x", False),
        ("x" * 256, False),
        (7, False),
    ],
)
def test_trust_domains(value: object, valid: bool) -> None:
    if valid:
        assert mesh_ca.validate_trust_domain(value) == value
    else:
        with pytest.raises(mesh_ca.TrustDomainError):
            mesh_ca.validate_trust_domain(value)


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({}, "c1.acme.mesh.local"),
        ({"trustDomain": None}, "c1.acme.mesh.local"),
        ({"trustDomain": "prod.example"}, "prod.example"),
    ],
)
def test_a_cluster_without_trust_domain_gets_the_default(
    spec: dict[str, object], expected: str
) -> None:
    assert mesh_ca.trust_domain_of("acme", "c1", spec) == expected
