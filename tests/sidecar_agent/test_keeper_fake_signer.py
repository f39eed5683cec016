"""The certificate keeper's loop with a fake signer (a test CA in-process stands in for
mgmt-api's Sign; the real one is exercised by tests/mesh): fresh keys, CA rotation, retries."""

from __future__ import annotations

import asyncio
import time

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from meshplane.backoff import Backoff
from meshplane.proto.workload.v1 import workload_pb2 as pb
from mgmt_api.domain import mesh_ca
from sidecar_agent.certificates import CertificateKeeper, KeeperMetrics, SignFailed
from sidecar_agent.sds import SecretState
from tests.support.workload_tokens import PodRef, TestIssuer

TD = "east.acme.mesh.local"
TOKEN = TestIssuer().token(PodRef("shop", "web-1", "web"))


class FakeSigner:
    """Signs with ``self.ca`` (swap it to rotate); ``down`` makes every call fail."""

    def __init__(self) -> None:
        self.ca = mesh_ca.new_ca(TD, time.time(), mesh_ca.new_key())
        self.down = False
        self.keys: list[bytes] = []

    async def __call__(self, csr_pem: str, token: str) -> pb.SignResponse:
        assert token == TOKEN
        if self.down:
            raise SignFailed("UNAVAILABLE: mgmt-api is away")
        csr = x509.load_pem_x509_csr(csr_pem.encode())
        uri = csr.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        (identity,) = uri.get_values_for_type(x509.UniformResourceIdentifier)
        assert identity == f"spiffe://{TD}/ns/shop/sa/web"
        public = csr.public_key()
        self.keys.append(
            public.public_bytes(
                serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
        cert = mesh_ca.issue_svid(self.ca, identity, public, time.time(), 3600)  # type: ignore[arg-type]
        return pb.SignResponse(
            certificate_chain_pem=mesh_ca.pem(cert),
            trust_bundle_pem=[mesh_ca.pem(self.ca.certificate)],
            not_after_unix=int(cert.not_valid_after_utc.timestamp()),
        )


def _keeper(signer: FakeSigner, failures: list[int]) -> tuple[CertificateKeeper, SecretState]:
    state = SecretState()
    keeper = CertificateKeeper(
        signer,
        token=lambda: TOKEN,
        trust_domain=TD,
        state=state,
        clock=time.time,
        metrics=KeeperMetrics(failed=lambda: failures.append(1)),
        backoff=Backoff(maximum=0.2, initial=0.01),
    )
    return keeper, state


async def _until(predicate: object, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


def test_each_new_trust_bundle_re_signs_at_once_with_a_new_key() -> None:
    async def scenario() -> None:
        signer, failures = FakeSigner(), list[int]()
        keeper, state = _keeper(signer, failures)
        task = asyncio.ensure_future(keeper.run())
        try:
            await _until(lambda: state.version == 1)
            first = keeper.issued
            assert first is not None
            keeper.trust_bundle_seen((mesh_ca.pem(signer.ca.certificate),))  # the same CA
            await asyncio.sleep(0.2)
            assert state.version == 1
            old = mesh_ca.pem(signer.ca.certificate)
            new_ca = mesh_ca.new_ca(TD, time.time(), mesh_ca.new_key())
            # A rotation's first step: the new CA joins the bundle, the old one still signs.
            keeper.trust_bundle_seen((old, mesh_ca.pem(new_ca.certificate)))
            await _until(lambda: state.version == 2)
            # Its second: the new CA signs.
            signer.ca = new_ca
            keeper.trust_bundle_seen((mesh_ca.pem(new_ca.certificate), old))
            await _until(lambda: state.version == 3)
            assert keeper.issued is not None
            assert keeper.issued.signed_by(mesh_ca.pem(new_ca.certificate))
            assert len(set(signer.keys)) == 3  # a new key each time
            await asyncio.sleep(0.2)
            assert state.version == 3  # each bundle once: no loop
        finally:
            task.cancel()

    asyncio.run(scenario())


def test_while_mgmt_api_is_away_the_certificate_stays_and_sign_is_retried() -> None:
    async def scenario() -> None:
        signer, failures = FakeSigner(), list[int]()
        signer.down = True
        keeper, state = _keeper(signer, failures)
        task = asyncio.ensure_future(keeper.run())
        try:
            await _until(lambda: len(failures) >= 3)
            assert state.secret is None
            signer.down = False
            await _until(lambda: state.version == 1)
            held = state.secret
            signer.down = True
            signer.ca = mesh_ca.new_ca(TD, time.time(), mesh_ca.new_key())
            keeper.trust_bundle_seen((mesh_ca.pem(signer.ca.certificate),))
            count = len(failures)
            await _until(lambda: len(failures) >= count + 2)
            assert state.secret is held and state.version == 1  # still served
        finally:
            task.cancel()

    asyncio.run(scenario())


def test_without_a_trust_domain_it_waits_for_the_bundle_and_takes_its_cas() -> None:
    async def scenario() -> None:
        signer, failures = FakeSigner(), list[int]()
        state = SecretState()
        keeper = CertificateKeeper(
            signer,
            token=lambda: TOKEN,
            trust_domain=None,
            state=state,
            clock=time.time,
            metrics=KeeperMetrics(failed=lambda: failures.append(1)),
        )
        task = asyncio.ensure_future(keeper.run())
        try:
            await asyncio.sleep(0.2)
            assert signer.keys == [] and failures == []  # nothing asked, nothing failed
            keeper.trust_bundle_seen((mesh_ca.pem(signer.ca.certificate),))
            await _until(lambda: state.version == 1)
            assert keeper.trust_domain == TD
        finally:
            task.cancel()

    asyncio.run(scenario())
