"""Workload token verification, CSR checks and sidecar admission (pure, clock injected): tables.

Tokens are minted with a test issuer key (:class:`tests.support.workload_tokens.TestIssuer`),
in the projected service-account token's claim shape.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import jwt
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

from meshplane.sidecar_contract import SidecarNode, spiffe_id
from mgmt_api.domain import workload_attest as wa
from tests.support.workload_tokens import PodRef, TestIssuer, kubernetes_io

NOW = 1_800_000_000.0
TD = "c1.acme.mesh.local"
ISSUER = TestIssuer("https://kubernetes.default.svc")
RSA_ISSUER = TestIssuer("https://rsa.example", rsa_key=True)
# Another cluster with the same (default) issuer URL, but its own key.
OTHER_CLUSTER = TestIssuer("https://kubernetes.default.svc")
WEB = PodRef("shop", "web-1", "web", ip="10.0.0.5", services=("web",))
GONE = PodRef("shop", "gone-1", "web", ip="10.0.0.6", services=("web",))


def _trust(
    *pods: PodRef, issuers: tuple[TestIssuer, ...] = (ISSUER, RSA_ISSUER)
) -> wa.ClusterTrust:
    status = {
        "state": {"serviceAccountIssuer": issuers[0].registration()},
        "namespaces": [{"name": "shop", "pods": [p.report() for p in pods]}],
    }
    spec = {"workloadIdentity": {"issuers": [i.registration() for i in issuers[1:]]}}
    return wa.trust_of(status, spec)


TRUST = _trust(WEB)


def _none_alg(pod: PodRef) -> str:
    good = ISSUER.token(pod, now=NOW)
    payload = jwt.decode(good, options={"verify_signature": False})
    return jwt.encode(payload, "", algorithm="none")  # PyJWT takes "" for no key


def _hs256(pod: PodRef) -> str:
    payload = jwt.decode(ISSUER.token(pod, now=NOW), options={"verify_signature": False})
    return jwt.encode(payload, "secret-" * 5, algorithm="HS256", headers={"kid": ISSUER.kid})


def _recreated(pod: PodRef) -> str:
    return ISSUER.token(PodRef(pod.namespace, pod.name, pod.service_account), now=NOW)


def _kube(**pod: Any) -> dict[str, Any]:
    return {
        "namespace": "shop",
        "pod": {"name": WEB.name, "uid": WEB.uid, **pod},
        "serviceaccount": {"name": "web"},
    }


CASES: list[tuple[str, Callable[[], str], str | None]] = [
    ("a token of the cluster's reported issuer", lambda: ISSUER.token(WEB, now=NOW), None),
    ("an admin-registered issuer (RS256)", lambda: RSA_ISSUER.token(WEB, now=NOW), None),
    ("within the skew of exp", lambda: ISSUER.token(WEB, now=NOW - 3630, ttl=3600), None),
    ("aud as a list", lambda: ISSUER.token(WEB, now=NOW, audience=["x", "meshplane"]), None),
    ("no aud", lambda: ISSUER.token(WEB, now=NOW, aud=None), "audience"),
    ("another audience", lambda: ISSUER.token(WEB, now=NOW, audience="api"), "audience"),
    ("expired", lambda: ISSUER.token(WEB, now=NOW - 7200, ttl=3600), "expired"),
    ("not yet valid", lambda: ISSUER.token(WEB, now=NOW + 600), "not_yet_valid"),
    ("no exp", lambda: ISSUER.token(WEB, now=NOW, exp=None), "claims"),
    ("alg none", lambda: _none_alg(WEB), "algorithm"),
    ("alg HS256", lambda: _hs256(WEB), "algorithm"),
    ("unknown issuer", lambda: TestIssuer("https://evil").token(WEB, now=NOW), "issuer"),
    (
        "another cluster's key, same issuer URL",
        lambda: OTHER_CLUSTER.token(WEB, now=NOW),
        "signature",
    ),
    ("a deleted pod", lambda: ISSUER.token(GONE, now=NOW), "pod_unknown"),
    ("a recreated pod (uid mismatch)", lambda: _recreated(WEB), "pod_uid"),
    (
        "sub does not match kubernetes.io",
        lambda: ISSUER.token(WEB, now=NOW, sub="system:serviceaccount:shop:admin"),
        "claims",
    ),
    (
        "another service account than the pod runs as",
        lambda: ISSUER.token(PodRef("shop", WEB.name, "admin", uid=WEB.uid), now=NOW),
        "service_account",
    ),
    (
        "no pod claim",
        lambda: ISSUER.token(WEB, now=NOW, **kubernetes_io({"namespace": "shop"})),
        "claims",
    ),
    ("garbage", lambda: "not.a.jwt", "malformed"),
    ("too long", lambda: "a." * 5000 + "b", "malformed"),
    (
        "pod uid in the claim of another pod",
        lambda: ISSUER.token(WEB, now=NOW, **kubernetes_io(_kube(uid="x"))),
        "pod_uid",
    ),
]


@pytest.mark.parametrize(("case", "token", "reason"), CASES, ids=[c[0] for c in CASES])
def test_verification_table(case: str, token: Callable[[], str], reason: str | None) -> None:
    if reason is None:
        attested = wa.verify(token(), TRUST, NOW)
        assert (attested.claims.namespace, attested.claims.service_account) == ("shop", "web")
        assert attested.pod.uid == WEB.uid
        assert attested.spiffe_id(TD) == spiffe_id(TD, "shop", "web")
    else:
        with pytest.raises(wa.AttestationError) as caught:
            wa.verify(token(), TRUST, NOW)
        assert caught.value.reason == reason, str(caught.value)


def test_a_deleted_pod_stops_verifying_with_the_next_inventory() -> None:
    token = ISSUER.token(WEB, now=NOW)
    grant = wa.verify(token, TRUST, NOW).grant
    assert wa.still_there(TRUST, grant) is None
    after = _trust()  # the next report no longer lists the pod
    assert "not in the cluster's inventory" in (wa.still_there(after, grant) or "")
    with pytest.raises(wa.AttestationError, match="not in the cluster's inventory"):
        wa.verify(token, after, NOW)
    recreated = _trust(PodRef(WEB.namespace, WEB.name, WEB.service_account))
    assert "another uid" in (wa.still_there(recreated, grant) or "")


# ---- JWKS and issuers, as written by an admin or reported by an agent -------------------


def _small_rsa() -> dict[str, Any]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=1024).public_key()
    return {"keys": [json.loads(jwt.get_algorithm_by_name("RS256").to_jwk(key))]}


@pytest.mark.parametrize(
    ("value", "member", "problem"),
    [
        (ISSUER.registration(), None, None),
        ({"issuer": "", "jwks": ISSUER.jwks()}, "issuer", "URL"),
        ({"issuer": "x" * 600, "jwks": ISSUER.jwks()}, "issuer", "URL"),
        ({"issuer": "https://i", "jwks": {"keys": []}}, "jwks", "1 to 16"),
        ({"issuer": "https://i", "jwks": []}, "jwks", "keys"),
        (
            {"issuer": "https://i", "jwks": {"keys": [{**ISSUER.jwks()["keys"][0], "d": "AAAA"}]}},
            "jwks",
            "private members ['d']",
        ),
        (
            {"issuer": "https://i", "jwks": {"keys": [{"kty": "oct", "k": "AAAA"}]}},
            "jwks",
            "RSA or EC",
        ),
        (
            {"issuer": "https://i", "jwks": {"keys": [{"kty": "EC", "crv": "P-256", "x": "A"}]}},
            "jwks",
            "not a usable key",
        ),
        (
            {
                "issuer": "https://i",
                "jwks": {"keys": [{**ISSUER.jwks()["keys"][0], "pad": "x" * 17000}]},
            },
            "jwks",
            "16384 bytes",
        ),
        ("nope", "", "must be"),
        (
            {
                "issuer": "https://i",
                "jwks": {"keys": [{**ISSUER.jwks()["keys"][0], "crv": "P-384"}]},
            },
            "jwks",
            "P-256",
        ),
        (
            {"issuer": "https://i", "jwks": _small_rsa()},
            "jwks",
            "at least 2048 bits",
        ),
    ],
)
def test_issuer_validation(value: object, member: str | None, problem: str | None) -> None:
    found = wa.issuer_problem(value)
    if problem is None:
        assert found is None
    else:
        assert found is not None and found[0] == member and problem in found[1], found


# ---- CSRs ------------------------------------------------------------------------------

ID = spiffe_id(TD, "shop", "web")


def _csr(
    key: Any = None, sans: list[x509.GeneralName] | None = None, *, cn: str | None = None
) -> tuple[str, Any]:
    key = key or ec.generate_private_key(ec.SECP256R1())
    names = [x509.NameAttribute(NameOID.COMMON_NAME, cn)] if cn else []
    builder = x509.CertificateSigningRequestBuilder().subject_name(x509.Name(names))
    if sans is None:
        sans = [x509.UniformResourceIdentifier(ID)]
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=True)
    csr = builder.sign(key, hashes.SHA256())
    from cryptography.hazmat.primitives import serialization

    return csr.public_bytes(serialization.Encoding.PEM).decode(), key


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda: _csr()[0], None),
        (
            lambda: _csr(sans=[x509.UniformResourceIdentifier(spiffe_id(TD, "shop", "admin"))])[0],
            "csr_identity",
        ),
        (
            lambda: _csr(
                sans=[x509.UniformResourceIdentifier(ID), x509.UniformResourceIdentifier(ID + "x")]
            )[0],
            "csr_identity",
        ),
        (
            lambda: _csr(sans=[x509.UniformResourceIdentifier(ID), x509.DNSName("web.shop")])[0],
            "csr_identity",
        ),
        (lambda: _csr(sans=[])[0], "csr_identity"),
        (lambda: _csr(ec.generate_private_key(ec.SECP384R1()))[0], "csr_invalid"),
        (
            lambda: _csr(rsa.generate_private_key(public_exponent=65537, key_size=2048))[0],
            "csr_invalid",
        ),
        (
            lambda: (
                "-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n"
            ),
            "csr_invalid",
        ),
        (lambda: "x" * 9000, "csr_invalid"),
    ],
)
def test_csr_table(make: Callable[[], str], reason: str | None) -> None:
    if reason is None:
        assert isinstance(wa.check_csr(make(), ID), ec.EllipticCurvePublicKey)
    else:
        with pytest.raises(wa.AttestationError) as caught:
            wa.check_csr(make(), ID)
        assert caught.value.reason == reason


def test_a_key_is_signed_once_and_the_ledger_is_bounded() -> None:
    seen = wa.SeenKeys(limit=2)
    keys = [wa.key_digest(ec.generate_private_key(ec.SECP256R1()).public_key()) for _ in range(3)]
    assert seen.claim(keys[0]) and not seen.claim(keys[0])
    assert seen.claim(keys[1]) and seen.claim(keys[2])
    assert seen.claim(keys[0])  # the oldest was forgotten past the limit


# ---- a sidecar's node against its verified pod -----------------------------------------


def _node(**kw: Any) -> SidecarNode:
    base: dict[str, Any] = {
        "namespace": "shop",
        "service_account": "web",
        "service": "web",
        "app_port": 8080,
        "inbound_host": "10.0.0.5",
    }
    return SidecarNode("acme", "c1", "web-1", **{**base, **kw})


LOCAL = PodRef("shop", "local-1", "web", ip="127.0.0.1", services=("web",))


@pytest.mark.parametrize(
    ("pod", "node", "reason"),
    [
        (WEB, _node(), None),
        (WEB, _node(namespace="kube-system"), "identity"),
        (WEB, _node(service_account="admin"), "identity"),
        (WEB, _node(service="payments"), "service"),
        (WEB, _node(inbound_host="10.0.0.9"), "address"),
        (WEB, _node(inbound_host="127.0.0.1"), "address"),  # loopback only in the local mode
        (LOCAL, _node(inbound_host="127.0.0.1"), None),
        (LOCAL, _node(inbound_host="10.0.0.5"), "address"),
    ],
)
def test_sidecar_admission_table(pod: PodRef, node: SidecarNode, reason: str | None) -> None:
    trust = _trust(pod)
    attested = wa.verify(ISSUER.token(pod, now=NOW), trust, NOW)
    refusal = wa.sidecar_refusal(attested, node)
    assert (refusal.reason if refusal else None) == reason
