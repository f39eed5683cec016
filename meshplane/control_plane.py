"""``--control-plane``: run a service from the management plane's policy stream.

Shared by ``extauthz serve`` and ``ratelimit serve`` so both behave the same:

``--control-plane URL --cluster ORG/CLUSTER --credentials FILE [--cache-dir DIR]``

- URL is ``grpcs://host:port`` (TLS; the server certificate is checked
  against ``--control-plane-ca FILE``, or the system's roots without it;
  ``--control-plane-cert``/``--control-plane-key`` add a client certificate
  when the management plane requires mutual TLS) or ``grpc://host:port``
  (plaintext). A bare ``HOST:PORT`` still works and means plaintext, with a
  warning: snapshots carry inline JWT secrets and the stream's token.

- FILE is the key material of the cluster's install template
  (``helm.secrets.clusterServiceAccount``: ``{clusterFqn, serviceAccountFqn,
  keyId, jwk, encodedJwk}`` as JSON or YAML), or just its ``jwk`` (the private
  JWK JSON) or ``encodedJwk`` (its base64). Each connection authenticates with
  a fresh short-lived ES256 JWT signed with that key, in the format the
  management API verifies (``kid`` = key id, ``iat``/``exp``), with the
  policy-distribution audience: the management plane accepts it on the
  stream only, so a token seen on the wire is no REST credential.
- The supervisor runs a :class:`~meshplane.distribution_client.SnapshotSubscriber`
  in a background thread with its own event loop. It reconnects with backoff
  and keeps the last good snapshot in ``DIR/current``.
- The workers load ``DIR/current`` with their usual ``FileSource``, polled
  every :data:`RELOAD_INTERVAL` seconds, so static and streamed modes share
  one loader and one reload path; a restart with the management plane down
  starts from the cached snapshot.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import grpc
import jwt
import yaml

from meshplane.config_error import ConfigError
from meshplane.distribution_client import SnapshotSubscriber, ensure_cache
from meshplane.distribution_contract import TOKEN_AUDIENCE, NodeIdentity
from meshplane.netaddr import is_loopback_host, parse_listen

log = logging.getLogger(__name__)

# How often workers poll the snapshot directory. A poll is a few stat calls of one
# small directory (about 0.1 ms with the thread hop), so 25 ms costs ~0.5 % of a
# core per worker and keeps the poll a small part of the propagation latency
# (docs/benchmarks.md, "Policy propagation").
RELOAD_INTERVAL = 0.025
# Lifetime of each connection's token: it is only checked when a stream opens.
TOKEN_TTL_SECONDS = 300


def add_arguments(
    parser: argparse.ArgumentParser,
    *,
    title: str = "management plane (instead of --config)",
    cache: bool = True,
) -> None:
    """The ``--control-plane`` flags; ``cache=False`` leaves out ``--cache-dir``
    (the cluster agent keeps no snapshots)."""
    group = parser.add_argument_group(title)
    group.add_argument(
        "--control-plane",
        help="gRPC address of mgmt-api: grpcs://HOST:PORT (TLS), grpc://HOST:PORT "
        "(plaintext), or HOST:PORT (plaintext, deprecated)",
    )
    group.add_argument(
        "--control-plane-ca", help="PEM CA bundle that signs mgmt-api's certificate (grpcs://)"
    )
    group.add_argument(
        "--control-plane-cert", help="PEM client certificate, when mgmt-api requires mTLS"
    )
    group.add_argument("--control-plane-key", help="PEM key of --control-plane-cert")
    group.add_argument("--cluster", help="ORG/CLUSTER whose policies this instance enforces")
    group.add_argument(
        "--credentials",
        help="this component's key of the cluster (its install-template entry, e.g. "
        "secrets.extauthzServiceAccount)",
    )
    if cache:
        group.add_argument(
            "--cache-dir",
            help="where snapshots are kept (default: ./.data/<service>-<org>-<cluster>)",
        )


@dataclass(frozen=True)
class ServiceAccountKey:
    """The private key a cluster's agent account signs its tokens with."""

    private_jwk: Mapping[str, Any]
    subject: str | None = None
    cluster_fqn: str | None = None

    @property
    def key_id(self) -> str:
        return str(self.private_jwk["kid"])

    def token(
        self,
        now: float | None = None,
        ttl: int = TOKEN_TTL_SECONDS,
        audience: str = TOKEN_AUDIENCE,
    ) -> str:
        """A token for one stream: the distribution audience by default (the agent's
        tunnel has its own), so the REST API never accepts it."""
        now = time.time() if now is None else now
        claims: dict[str, Any] = {"iat": int(now), "exp": int(now) + ttl, "aud": audience}
        if self.subject:
            claims["sub"] = self.subject
        key = jwt.PyJWK.from_dict(dict(self.private_jwk))
        return jwt.encode(claims, key.key, algorithm="ES256", headers={"kid": self.key_id})


def _jwk_from(value: Any, source: str) -> dict[str, Any]:
    if isinstance(value, dict):
        return value
    if isinstance(value, str):
        text = value.strip()
        if not text.startswith("{"):
            try:
                text = base64.b64decode(text, validate=True).decode()
            except ValueError:
                raise ConfigError("not a JWK, nor base64 of one", source=source) from None
        try:
            parsed = json.loads(text)
        except json.JSONDecodeError:
            raise ConfigError("not a JWK, nor base64 of one", source=source) from None
        if isinstance(parsed, dict):
            return parsed
    raise ConfigError("not a JWK, nor base64 of one", source=source)


def load_credentials(path: Path) -> ServiceAccountKey:
    """Read FILE: the template's ``clusterServiceAccount``, its ``jwk`` or ``encodedJwk``."""
    source = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read credentials: {exc.strerror}", source=source) from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError:
        doc = text
    if isinstance(doc, dict) and "clusterServiceAccount" in doc:
        doc = doc["clusterServiceAccount"]
    subject = cluster = None
    if isinstance(doc, dict) and ("jwk" in doc or "encodedJwk" in doc):
        subject, cluster = doc.get("serviceAccountFqn"), doc.get("clusterFqn")
        jwk_value = doc["jwk"] if "jwk" in doc else doc["encodedJwk"]
        jwk_doc = _jwk_from(jwk_value, source)
    else:
        jwk_doc = _jwk_from(doc if isinstance(doc, dict) else text, source)
    if jwk_doc.get("kty") != "EC" or "d" not in jwk_doc or not jwk_doc.get("kid"):
        raise ConfigError("the key must be a private EC JWK with a kid", source=source)
    try:
        jwt.PyJWK.from_dict(jwk_doc)
    except jwt.PyJWTError as exc:
        raise ConfigError(f"unusable key: {exc}", source=source) from None
    return ServiceAccountKey(jwk_doc, subject, cluster)


@dataclass(frozen=True)
class Target:
    """Where the management plane's stream is, and whether it speaks TLS."""

    address: str  # gRPC target, host:port
    tls: bool
    bare: bool = False  # given as HOST:PORT, without a scheme

    @property
    def loopback(self) -> bool:
        return is_loopback_host(self.address.rpartition(":")[0])


def parse_target(value: str) -> Target:
    """``grpcs://host:port``, ``grpc://host:port`` or a bare ``HOST:PORT``; ValueError."""
    if "://" not in value:
        parse_listen(value)
        return Target(value, tls=False, bare=True)
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError:
        raise ValueError(f"{value!r} is not grpcs://HOST:PORT or grpc://HOST:PORT") from None
    if (
        parts.scheme not in ("grpc", "grpcs")
        or not parts.hostname
        or port is None
        or parts.path not in ("", "/")
        or parts.query
        or parts.fragment
        or parts.username is not None
    ):
        raise ValueError(f"{value!r} is not grpcs://HOST:PORT or grpc://HOST:PORT")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return Target(f"{host}:{port}", tls=parts.scheme == "grpcs")


@dataclass(frozen=True)
class ClientTlsFiles:
    """The PEM files of a ``grpcs://`` subscription (each optional)."""

    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None

    def credentials(self) -> grpc.ChannelCredentials:
        """Read the files; an unreadable one is a ConfigError naming its flag."""

        def read(path: Path | None, flag: str) -> bytes | None:
            if path is None:
                return None
            try:
                return path.read_bytes()
            except OSError as exc:
                raise ConfigError(f"cannot read {path}: {exc.strerror}", field=flag) from None

        return grpc.ssl_channel_credentials(
            root_certificates=read(self.ca, "--control-plane-ca"),
            private_key=read(self.key, "--control-plane-key"),
            certificate_chain=read(self.cert, "--control-plane-cert"),
        )


@dataclass(frozen=True)
class ControlPlaneOptions:
    address: str
    organization: str
    cluster: str
    key: ServiceAccountKey
    cache_dir: Path
    tls: ClientTlsFiles | None = None  # None: plaintext

    def channel_credentials(self) -> grpc.ChannelCredentials | None:
        return None if self.tls is None else self.tls.credentials()


def _tls_files(args: argparse.Namespace, target: Target) -> ClientTlsFiles | None:
    flags = {
        "--control-plane-ca": getattr(args, "control_plane_ca", None),
        "--control-plane-cert": getattr(args, "control_plane_cert", None),
        "--control-plane-key": getattr(args, "control_plane_key", None),
    }
    if not target.tls:
        for flag, value in flags.items():
            if value:
                raise ConfigError("only with a grpcs:// --control-plane", field=flag)
        return None
    cert, key = flags["--control-plane-cert"], flags["--control-plane-key"]
    if bool(cert) != bool(key):
        field = "--control-plane-key" if cert else "--control-plane-cert"
        raise ConfigError("give --control-plane-cert and --control-plane-key together", field=field)
    files = ClientTlsFiles(*(Path(v) if v else None for v in flags.values()))
    files.credentials()  # unreadable files stop the start here, naming the flag
    return files


def options_from(args: argparse.Namespace, service: str) -> ControlPlaneOptions | None:
    """Validate the flags; None means static ``--config`` mode. Raises ConfigError."""
    config = getattr(args, "config", None)
    if not args.control_plane:
        if not config:
            raise ConfigError("give --config FILE, or --control-plane with --cluster")
        for flag in (
            "cluster",
            "credentials",
            "cache_dir",
            "control_plane_ca",
            "control_plane_cert",
            "control_plane_key",
        ):
            if getattr(args, flag, None):
                raise ConfigError("only with --control-plane", field="--" + flag.replace("_", "-"))
        return None
    if config:
        raise ConfigError("--config and --control-plane are exclusive", field="--config")
    try:
        target = parse_target(args.control_plane)
    except ValueError as exc:
        raise ConfigError(str(exc), field="--control-plane") from None
    tls = _tls_files(args, target)
    org, sep, cluster = (args.cluster or "").partition("/")
    if not sep or not org or not cluster or "/" in cluster:
        raise ConfigError("must be ORG/CLUSTER", field="--cluster")
    if not args.credentials:
        raise ConfigError("is required with --control-plane", field="--credentials")
    key = load_credentials(Path(args.credentials))
    expected = f"organizations/{org}/clusters/{cluster}"
    if key.cluster_fqn and key.cluster_fqn != expected:
        raise ConfigError(
            f"the credentials are for {key.cluster_fqn}, not {expected}", field="--credentials"
        )
    if target.bare:
        log.warning(
            "--control-plane HOST:PORT is plaintext; give grpcs://HOST:PORT (TLS) or, to keep "
            "plaintext on a trusted network, grpc://HOST:PORT",
            extra={"control_plane": args.control_plane},
        )
    elif not target.tls and not target.loopback:
        log.warning(
            "the policy stream is plaintext: snapshots (with inline JWT secrets) and the "
            "stream's token cross the network in clear; use grpcs://",
            extra={"control_plane": args.control_plane},
        )
    cache_dir = Path(
        getattr(args, "cache_dir", None) or os.path.join(".data", f"{service}-{org}-{cluster}")
    )
    return ControlPlaneOptions(target.address, org, cluster, key, cache_dir.resolve(), tls)


def start_subscriber(
    options: ControlPlaneOptions, service: str, loader: Callable[[Path], object]
) -> Path:
    """Start the subscriber thread; return the directory the workers should load.

    The thread is a daemon with its own event loop: the supervisor's main
    thread stays the plain signal-handling loop of ``meshplane.server``.
    """
    current = ensure_cache(options.cache_dir)
    node = NodeIdentity(
        service, options.organization, options.cluster, f"{socket.gethostname()}-{os.getpid()}"
    )
    subscriber = SnapshotSubscriber(
        options.address,
        node,
        loader,
        options.cache_dir,
        credentials=options.key.token,
        channel_credentials=options.channel_credentials(),
        on_applied=lambda version: log.info("policy snapshot live", extra={"version": version}),
    )

    def run() -> None:
        asyncio.run(subscriber.run())

    threading.Thread(target=run, name=f"{service}-policy-subscriber", daemon=True).start()
    log.info(
        "subscribed to the management plane",
        extra={
            "address": options.address,
            "tls": options.tls is not None,
            "cluster": f"{options.organization}/{options.cluster}",
            "cache": str(options.cache_dir),
            "applied_version": subscriber.applied_version,
        },
    )
    return current
