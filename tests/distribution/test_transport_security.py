"""The policy stream's transport and credentials: TLS, mutual TLS, audiences.

Snapshots carry inline JWT secrets and every connect carries a bearer token,
so the stream must be able to run over TLS, and a token seen on it must not
be a REST credential. The server here is the real servicer behind the real
TLS credentials of ``mgmt_api.distribution.hub``; the client is configured
through the services' own ``--control-plane*`` flags, with certificates made
by a throw-away CA in each test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import time
from pathlib import Path

import grpc
import pytest

from meshplane import control_plane
from meshplane.config_error import ConfigError
from meshplane.distribution_client import SnapshotSubscriber, current_dir
from meshplane.distribution_contract import NodeIdentity
from meshplane.proto.distribution.v1 import distribution_pb2_grpc as pb_grpc
from meshplane.tls import ListenerTlsFiles, grpcio_credentials
from mgmt_api.auth import keys as keymod
from mgmt_api.auth import tokens
from mgmt_api.distribution.feed import ChangeFeed
from mgmt_api.distribution.server import DistributionServicer
from mgmt_api.service.enforcement import Snapshot
from mgmt_api.service.instances import SubscriberRegistry
from mgmt_api.service.stream_auth import AuthError
from tests.support.certs import CertificateAuthority

NODE = NodeIdentity("ratelimit", "acme", "east", "pod-1")
TOKEN = "token-east"


def _loader(path: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(path.glob("*.yaml"))}


class Plane:
    """The real servicer over a dict of snapshots, with a fixed token."""

    def __init__(self) -> None:
        self.feed = ChangeFeed()
        self.registry = SubscriberRegistry()

    async def build(self, node: NodeIdentity) -> Snapshot:
        return Snapshot({"limits.yaml": b"requests: 3"})

    async def authenticate(self, token: str, node: NodeIdentity) -> str:
        if token != TOKEN:
            raise AuthError("bad token")
        return "key-1"


async def _serve(credentials: grpc.ServerCredentials) -> tuple[grpc.aio.Server, int]:
    plane = Plane()
    server = grpc.aio.server()
    pb_grpc.add_PolicyDistributionServicer_to_server(  # type: ignore[no-untyped-call]
        DistributionServicer(plane.build, plane.authenticate, plane.feed, plane.registry),
        server,
    )
    port = server.add_secure_port("127.0.0.1:0", credentials)
    await server.start()
    return server, port


@pytest.fixture
def pki(tmp_path: Path) -> tuple[CertificateAuthority, Path]:
    return CertificateAuthority(tmp_path), tmp_path


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config")
    control_plane.add_arguments(parser)
    return parser.parse_args(list(argv))


def _credentials_file(directory: Path) -> Path:
    pair = keymod.generate()
    path = directory / "credentials.json"
    path.write_text(json.dumps({"jwk": json.dumps(pair.private_jwk)}))
    return path


def _options(directory: Path, url: str, *tls: str) -> control_plane.ControlPlaneOptions:
    argv = ["--control-plane", url, "--cluster", "acme/east"]
    argv += ["--credentials", str(_credentials_file(directory)), *tls]
    options = control_plane.options_from(_args(*argv), "ratelimit")
    assert options is not None
    return options


async def _subscribe_once(options: control_plane.ControlPlaneOptions, cache: Path) -> str:
    """Open one stream as the service would; return the version it applied."""
    subscriber = SnapshotSubscriber(
        options.address,
        NODE,
        _loader,
        cache,
        credentials=lambda: TOKEN,
        channel_credentials=options.channel_credentials(),
    )
    task = asyncio.create_task(subscriber.run_once())
    try:
        deadline = time.monotonic() + 10
        while not subscriber.applied_version:
            if task.done():
                task.result()  # raises the stream's error
                raise AssertionError("the stream ended without a snapshot")
            if time.monotonic() > deadline:
                raise AssertionError("no snapshot in time")
            await asyncio.sleep(0.02)
    finally:
        task.cancel()
        with pytest.raises((asyncio.CancelledError, grpc.aio.AioRpcError)):
            await task
    return subscriber.applied_version


async def test_grpcs_with_the_servers_ca_receives_snapshots(
    pki: tuple[CertificateAuthority, Path],
) -> None:
    ca, tmp = pki
    server_cert = ca.issue("mgmt-api")
    server, port = await _serve(
        grpcio_credentials(ListenerTlsFiles(str(server_cert.cert), str(server_cert.key)))
    )
    try:
        options = _options(tmp, f"grpcs://127.0.0.1:{port}", "--control-plane-ca", str(ca.path))
        assert options.address == f"127.0.0.1:{port}" and options.tls is not None
        assert await _subscribe_once(options, tmp / "cache")
        assert _loader(current_dir(tmp / "cache")) == {"limits.yaml": "requests: 3"}
    finally:
        await server.stop(0)


async def test_plaintext_or_an_untrusted_ca_cannot_talk_to_a_tls_server(
    pki: tuple[CertificateAuthority, Path],
) -> None:
    ca, tmp = pki
    server_cert = ca.issue("mgmt-api")
    server, port = await _serve(
        grpcio_credentials(ListenerTlsFiles(str(server_cert.cert), str(server_cert.key)))
    )
    try:
        plaintext = _options(tmp, f"grpc://127.0.0.1:{port}")
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await _subscribe_once(plaintext, tmp / "a")
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        (tmp / "other").mkdir()
        other = CertificateAuthority(tmp / "other", "someone else")
        untrusted = _options(
            tmp, f"grpcs://127.0.0.1:{port}", "--control-plane-ca", str(other.path)
        )
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await _subscribe_once(untrusted, tmp / "b")
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        await server.stop(0)


async def test_mutual_tls_needs_a_client_certificate_from_the_client_ca(
    pki: tuple[CertificateAuthority, Path],
) -> None:
    ca, tmp = pki
    server_cert = ca.issue("mgmt-api")
    (tmp / "clients").mkdir()
    client_ca = CertificateAuthority(tmp / "clients", "client CA")
    tls = ListenerTlsFiles(str(server_cert.cert), str(server_cert.key), str(client_ca.path))
    server, port = await _serve(grpcio_credentials(tls))
    url = f"grpcs://127.0.0.1:{port}"
    try:
        without = _options(tmp, url, "--control-plane-ca", str(ca.path))
        with pytest.raises(grpc.aio.AioRpcError):
            await _subscribe_once(without, tmp / "a")
        wrong = ca.issue("not-a-client", client=True)  # right CA for servers, wrong for clients
        with pytest.raises(grpc.aio.AioRpcError):
            await _subscribe_once(
                _options(
                    tmp,
                    url,
                    "--control-plane-ca",
                    str(ca.path),
                    "--control-plane-cert",
                    str(wrong.cert),
                    "--control-plane-key",
                    str(wrong.key),
                ),
                tmp / "b",
            )
        client = client_ca.issue("ratelimit-east", client=True)
        mutual = _options(
            tmp,
            url,
            "--control-plane-ca",
            str(ca.path),
            "--control-plane-cert",
            str(client.cert),
            "--control-plane-key",
            str(client.key),
        )
        assert await _subscribe_once(mutual, tmp / "c")
    finally:
        await server.stop(0)


@pytest.mark.parametrize(
    ("value", "address", "tls", "bare"),
    [
        ("grpcs://mgmt.example:8444", "mgmt.example:8444", True, False),
        ("grpc://10.0.0.5:8444", "10.0.0.5:8444", False, False),
        ("grpcs://[::1]:8444", "[::1]:8444", True, False),
        ("mgmt.example:8444", "mgmt.example:8444", False, True),
    ],
)
def test_control_plane_urls(value: str, address: str, tls: bool, bare: bool) -> None:
    target = control_plane.parse_target(value)
    assert (target.address, target.tls, target.bare) == (address, tls, bare)


@pytest.mark.parametrize(
    "value",
    ["https://h:1", "grpcs://h", "grpcs://h:1/path", "grpcs://user@h:1", "grpc://h:99999", "nope"],
)
def test_bad_control_plane_urls(value: str) -> None:
    with pytest.raises(ValueError):
        control_plane.parse_target(value)


def test_plaintext_is_warned_about_unless_explicit_on_loopback(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="meshplane.control_plane")
    _options(tmp_path, "grpc://127.0.0.1:8444")
    assert not caplog.records
    _options(tmp_path, "127.0.0.1:8444")
    assert "plaintext" in caplog.records[-1].getMessage()
    caplog.clear()
    _options(tmp_path, "grpc://mgmt.example:8444")
    assert "plaintext" in caplog.records[-1].getMessage()


@pytest.mark.parametrize(
    ("argv", "field"),
    [
        (("grpc://h:1", "--control-plane-ca", "CA"), "--control-plane-ca"),
        (("grpcs://h:1", "--control-plane-cert", "CA"), "--control-plane-key"),
        (("grpcs://h:1", "--control-plane-ca", "/nonexistent/ca.pem"), "--control-plane-ca"),
    ],
)
def test_tls_flags_are_checked_at_start(
    pki: tuple[CertificateAuthority, Path], argv: tuple[str, ...], field: str
) -> None:
    ca, tmp = pki
    url, *rest = (str(ca.path) if a == "CA" else a for a in argv)
    with pytest.raises(ConfigError) as info:
        _options(tmp, url, *rest)
    assert info.value.field == field


def test_tls_flags_need_control_plane(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        control_plane.options_from(_args("--config", "x", "--control-plane-ca", "ca"), "extauthz")
    assert info.value.field == "--control-plane-ca"


def test_stream_tokens_and_rest_tokens_have_separate_audiences(tmp_path: Path) -> None:
    """A token captured on the stream cannot be replayed on REST, and vice versa."""
    pair = keymod.generate()
    path = tmp_path / "credentials.json"
    path.write_text(json.dumps({"jwk": json.dumps(pair.private_jwk)}))
    now = time.time()
    stream_token = control_plane.load_credentials(path).token(now)
    claims = tokens.verify_service_account(
        pair.public_jwk, stream_token, now, 3600, audience=tokens.DISTRIBUTION_AUDIENCE
    )
    assert claims.expires_at - claims.issued_at == control_plane.TOKEN_TTL_SECONDS
    with pytest.raises(tokens.TokenError, match="not accepted here"):
        tokens.verify_service_account(pair.public_jwk, stream_token, now, 3600)  # REST
    rest_token = tokens.sign_service_account(pair.private_jwk, "sa", now, 300)
    tokens.verify_service_account(pair.public_jwk, rest_token, now, 3600)
    with pytest.raises(tokens.TokenError, match="audience"):
        tokens.verify_service_account(
            pair.public_jwk, rest_token, now, 3600, audience=tokens.DISTRIBUTION_AUDIENCE
        )


def test_unreadable_server_tls_files_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(OSError, match=r"missing\.key"):
        grpcio_credentials(ListenerTlsFiles(str(tmp_path / "x.crt"), str(tmp_path / "missing.key")))
