"""The sidecar agent's pure parts: the token's identity, the CSR, half-life, CA rotation, SDS."""

from __future__ import annotations

import time

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from envoy.extensions.transport_sockets.tls.v3 import secret_pb2
from envoy.service.discovery.v3 import discovery_pb2

from meshplane.workload_contract import CA_SECRET, SVID_SECRET
from mgmt_api.domain import mesh_ca
from sidecar_agent import identity
from sidecar_agent.identity import Issued, TokenUnreadable
from sidecar_agent.relay import trust_bundle_of
from sidecar_agent.sds import SECRET_TYPE, answer, svid_secret
from tests.support.workload_tokens import PodRef, TestIssuer, kubernetes_io

TD = "east.acme.mesh.local"


def test_the_token_names_the_identity_the_csr_asks_for() -> None:
    token = TestIssuer().token(PodRef("shop", "web-1", "web"))
    claims = identity.token_claims(token)
    assert (claims.namespace, claims.service_account, claims.pod_name) == ("shop", "web", "web-1")
    assert identity.workload_id(TD, claims) == f"spiffe://{TD}/ns/shop/sa/web"


@pytest.mark.parametrize(
    ("token", "words"),
    [
        ("not a jwt", "not a JWT"),
        ("x" * (identity.MAX_TOKEN_BYTES + 1), "larger than"),
    ],
)
def test_an_unreadable_token_says_why_and_never_what(token: str, words: str) -> None:
    with pytest.raises(TokenUnreadable) as caught:
        identity.token_claims(token)
    assert words in str(caught.value)
    assert token[:20] not in str(caught.value) or token == "not a jwt"


def test_a_token_without_a_pod_claim_is_refused() -> None:
    kube = {"namespace": "shop", "serviceaccount": {"name": "web", "uid": "u"}}
    token = TestIssuer().token(PodRef("shop", "web-1", "web"), **kubernetes_io(kube))
    with pytest.raises(TokenUnreadable, match="not bound to a pod"):
        identity.token_claims(token)


def test_the_csr_holds_one_uri_san_and_a_fresh_p256_key() -> None:
    key = identity.new_key()
    csr = x509.load_pem_x509_csr(identity.csr_pem(key, f"spiffe://{TD}/ns/shop/sa/web").encode())
    assert csr.is_signature_valid
    sans = csr.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.UniformResourceIdentifier) == [
        f"spiffe://{TD}/ns/shop/sa/web"
    ]
    assert len(list(sans)) == 1
    public = csr.public_key()
    assert isinstance(public, ec.EllipticCurvePublicKey) and public.curve.name == "secp256r1"
    assert identity.new_key().public_key() != key.public_key()


def _issued(ca: mesh_ca.CertificateAuthority, now: float) -> Issued:
    key = mesh_ca.new_key()
    cert = mesh_ca.issue_svid(ca, f"spiffe://{TD}/ns/shop/sa/web", key.public_key(), now)
    return Issued.of(mesh_ca.pem(cert), (mesh_ca.pem(ca.certificate),), now)


@pytest.mark.parametrize(
    ("share", "due"), [(0.0, False), (0.25, False), (0.49, False), (0.5, True), (0.9, True)]
)
def test_renewal_is_due_at_half_life(share: float, due: bool) -> None:
    now = time.time()
    issued = _issued(mesh_ca.new_ca(TD, now, mesh_ca.new_key()), now)
    life = issued.not_after - now  # from receiving it (its notBefore is backdated)
    assert issued.due(now + life * share) is due


def test_a_short_lived_certificate_is_not_due_at_once_despite_its_backdated_not_before() -> None:
    now = time.time()
    ca = mesh_ca.new_ca(TD, now, mesh_ca.new_key())
    key = mesh_ca.new_key()
    cert = mesh_ca.issue_svid(ca, f"spiffe://{TD}/ns/shop/sa/web", key.public_key(), now, 30)
    issued = Issued.of(mesh_ca.pem(cert), (), now)
    assert cert.not_valid_before_utc.timestamp() < now - 30  # backdated for clock skew
    assert not issued.due(now + 1)
    assert issued.due(now + 15)


def test_a_new_signing_ca_is_not_the_issuer_of_the_current_certificate() -> None:
    now = time.time()
    old = mesh_ca.new_ca(TD, now, mesh_ca.new_key())
    new = mesh_ca.new_ca(TD, now, mesh_ca.new_key())  # same name, another key
    issued = _issued(old, now)
    assert issued.signed_by(mesh_ca.pem(old.certificate))
    assert not issued.signed_by(mesh_ca.pem(new.certificate))
    assert not issued.signed_by("not a certificate")


def _ca_response(*pems: str) -> discovery_pb2.DiscoveryResponse:
    secret = secret_pb2.Secret(name=CA_SECRET)
    secret.validation_context.trusted_ca.inline_string = "".join(pems)
    response = discovery_pb2.DiscoveryResponse(type_url=SECRET_TYPE, version_info="1")
    response.resources.add().Pack(secret)
    return response


def test_the_relay_reads_the_signing_ca_first_in_the_trust_bundle() -> None:
    now = time.time()
    first, second = (
        mesh_ca.pem(mesh_ca.new_ca(TD, now, mesh_ca.new_key()).certificate) for _ in range(2)
    )
    assert trust_bundle_of(_ca_response(first, second)) == (first, second)
    other = discovery_pb2.DiscoveryResponse(type_url="type.googleapis.com/x", version_info="1")
    assert trust_bundle_of(other) is None


def test_sds_answers_once_per_version_and_only_what_was_asked() -> None:
    secret = svid_secret("CERT", "KEY")
    asked = frozenset({SVID_SECRET})
    assert answer(0, None, asked, 0, 1) is None  # nothing signed yet
    assert answer(1, secret, frozenset(), 0, 1) is None  # nothing asked yet
    first = answer(1, secret, asked, 0, 1)
    assert first is not None and first.version_info == "1" and first.nonce == "1"
    unpacked = secret_pb2.Secret()
    assert first.resources[0].Unpack(unpacked) and unpacked.name == SVID_SECRET
    assert answer(1, secret, asked, 1, 2) is None  # already sent
    assert answer(2, secret, asked, 1, 2) is not None  # a new certificate


def test_the_trust_domain_is_the_one_the_mesh_ca_names() -> None:
    ca = mesh_ca.new_ca("custom.example", time.time(), mesh_ca.new_key())
    assert identity.trust_domain_of(mesh_ca.pem(ca.certificate)) == "custom.example"
    assert identity.trust_domain_of("garbage") is None
