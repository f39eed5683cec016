"""A fake Kubernetes API server: the one fake in the agent's tests (no cluster runs here).

HTTPS with a test CA and a bearer token, as in a pod. It serves what the
agent reads: pods (with equality label selectors; uid, service account),
namespaces, services, ``/version``, the service-account issuer discovery
(``/.well-known/openid-configuration`` and its ``jwks_uri``, when
:attr:`FakeKubeApi.issuer` is set), and ``pods/{pod}/log`` (``tailLines``,
``follow``, ``timestamps``), whose lines are a real Envoy's log file, so pod
logs are what that proxy really wrote.
"""

from __future__ import annotations

import datetime as dt
import json
import select
import ssl
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

TOKEN = "fake-service-account-token"


class FakeKubeApi:
    def __init__(self, cert: Path, key: Path) -> None:
        self.pods: list[dict[str, Any]] = []
        self.namespaces = ["shop", "kube-system"]
        self.services: list[dict[str, Any]] = []
        self.log_files: dict[str, Path] = {}  # pod name -> log file
        self.requests: list[tuple[str, dict[str, list[str]]]] = []
        self.open_streams = 0
        #: The service-account issuer: {"issuer": URL, "jwks": {"keys": [...]}}, or None.
        self.issuer: dict[str, Any] | None = None
        self._lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                return

            def do_GET(self) -> None:
                fake.handle(self)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._stopping = False

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def start(self) -> FakeKubeApi:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping = True
        self.server.shutdown()
        self.server.server_close()

    def add_pod(
        self,
        namespace: str,
        name: str,
        ip: str | None,
        labels: dict[str, str],
        service_account: str = "default",
    ) -> str:
        """A pod; returns its uid."""
        uid = str(uuid.uuid4())
        self.pods.append(
            {
                "metadata": {"namespace": namespace, "name": name, "labels": labels, "uid": uid},
                "spec": {"serviceAccountName": service_account},
                "status": {
                    "phase": "Running" if ip else "Pending",
                    **({"podIP": ip} if ip else {}),
                },
            }
        )
        return uid

    def _json(self, handler: BaseHTTPRequestHandler, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    def handle(self, handler: BaseHTTPRequestHandler) -> None:
        url = urlsplit(handler.path)
        query = parse_qs(url.query)
        with self._lock:
            self.requests.append((url.path, query))
        if handler.headers.get("authorization") != f"Bearer {TOKEN}":
            self._json(handler, 401, {"kind": "Status", "code": 401})
            return
        parts = url.path.strip("/").split("/")
        if url.path == "/version":
            self._json(handler, 200, {"gitVersion": "v1.31.0-fake"})
        elif url.path == "/api/v1/pods":
            selector = dict(
                item.split("=", 1)
                for item in query.get("labelSelector", [""])[0].split(",")
                if item
            )
            items = [
                p
                for p in self.pods
                if all(p["metadata"]["labels"].get(k) == v for k, v in selector.items())
            ]
            self._json(handler, 200, {"kind": "PodList", "items": items})
        elif url.path == "/.well-known/openid-configuration" and self.issuer is not None:
            # jwks_uri names the issuer's public address; the agent reads its path here.
            jwks_uri = "https://issuer.example.test/openid/v1/jwks"
            self._json(handler, 200, {"issuer": self.issuer["issuer"], "jwks_uri": jwks_uri})
        elif url.path == "/openid/v1/jwks" and self.issuer is not None:
            self._json(handler, 200, self.issuer["jwks"])
        elif url.path == "/api/v1/namespaces":
            items = [{"metadata": {"name": n, "labels": {}}} for n in self.namespaces]
            self._json(handler, 200, {"kind": "NamespaceList", "items": items})
        elif url.path == "/api/v1/services":
            self._json(handler, 200, {"kind": "ServiceList", "items": self.services})
        elif len(parts) == 7 and parts[4] == "pods" and parts[6] == "log":
            self._logs(handler, parts[5], query)
        else:
            self._json(handler, 404, {"kind": "Status", "code": 404})

    def _logs(self, handler: BaseHTTPRequestHandler, pod: str, query: dict[str, list[str]]) -> None:
        path = self.log_files.get(pod)
        if path is None or query.get("container") != ["istio-proxy"]:
            self._json(handler, 404, {"kind": "Status", "code": 404})
            return
        handler.send_response(200)
        handler.send_header("Content-Type", "text/plain")
        handler.end_headers()  # HTTP/1.0: the body ends when the connection closes
        stamped = query.get("timestamps") == ["true"]

        def write(line: str) -> None:
            now = dt.datetime.now(dt.UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")
            handler.wfile.write(((f"{now} " if stamped else "") + line + "\n").encode())
            handler.wfile.flush()

        with path.open() as f:
            lines = f.read().splitlines()
            tail = int(query.get("tailLines", ["0"])[0])
            for line in lines[-tail:] if tail else []:
                write(line)
            if query.get("follow") != ["true"]:
                return
            with self._lock:
                self.open_streams += 1
            try:
                while not self._stopping:
                    line = f.readline()
                    if line:
                        write(line.rstrip("\n"))
                    else:
                        # The client sends nothing after its request: a readable
                        # socket means it closed the connection (it left).
                        readable, _, _ = select.select([handler.connection], [], [], 0.05)
                        if readable:
                            return
            except OSError:
                pass
            finally:
                with self._lock:
                    self.open_streams -= 1
