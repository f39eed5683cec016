"""Who may ask the webhook for a patch, and what its parser refuses: real TLS sockets and
real AdmissionReview JSON against the injector process.

No Kubernetes API server runs here: the tests play it, presenting a client
certificate the injector's ``--client-ca`` signs (the fake API server's). A
client without one, or with another CA's, gets no answer at all (the TLS
handshake fails); with ``--client-name``, a certificate of the right CA but
another name gets a 403 and no patch. JSON nested deeper than 64 levels
(100,000 in the reproduction) is a 400 with the AdmissionReview error body,
never a ``RecursionError``, and the webhook keeps serving.
"""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.injector.support import APISERVER, Injector, patch_of, pod, review
from tests.support.certs import CertificateAuthority


def _exchange(injector: Injector, context: ssl.SSLContext, request: bytes) -> bytes:
    """What the webhook sends back on a raw TLS connection (b"" or an error when nothing)."""
    with socket.create_connection(("127.0.0.1", injector.port), timeout=30) as sock:
        with context.wrap_socket(sock, server_hostname="localhost") as tls:
            tls.sendall(request)
            chunks = []
            while chunk := tls.recv(65536):
                chunks.append(chunk)
    return b"".join(chunks)


def _post(body: bytes) -> bytes:
    return (
        b"POST /mutate HTTP/1.1\r\nHost: injector\r\nContent-Type: application/json\r\n"
        b"Connection: close\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )


def _nothing(injector: Injector, context: ssl.SSLContext) -> None:
    """The review on ``context`` gets no HTTP answer: the handshake is refused."""
    answer = b""
    with contextlib.suppress(ssl.SSLError, ConnectionError):
        answer = _exchange(injector, context, _post(json.dumps(review(pod())).encode()))
    assert answer == b"", answer[:200]


def test_an_anonymous_review_gets_nothing_fake_apiserver_client_cert(injector: Injector) -> None:
    anonymous = ssl.create_default_context(cafile=str(injector.ca.path))
    _nothing(injector, anonymous)
    with pytest.raises(httpx.TransportError):
        httpx.post(f"{injector.url}/mutate", json=review(pod()), verify=anonymous, timeout=30)
    # The API server's certificate is answered, with the patch.
    with injector.client() as client:
        answer = client.post("/mutate", json=review(pod()))
    assert answer.status_code == 200
    assert patch_of(answer.json()) is not None


def test_a_client_certificate_of_another_ca_gets_nothing_fake_apiserver_client_cert(
    injector: Injector, tmp_path: Path
) -> None:
    other = CertificateAuthority(tmp_path)
    forged = other.issue(APISERVER, client=True)  # the right name, the wrong CA
    _nothing(injector, injector.tls_context(forged))


def test_the_probes_need_no_certificate_on_the_metrics_port_fake_apiserver_client_cert(
    injector: Injector,
) -> None:
    for path in ("/healthz", "/readyz"):
        probe = httpx.get(f"http://127.0.0.1:{injector.metrics_port}{path}", timeout=30)
        assert probe.status_code == 200, path
    # The metrics port serves no reviews.
    nope = httpx.post(f"http://127.0.0.1:{injector.metrics_port}/mutate", timeout=30)
    assert nope.status_code == 404


def _nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = {"x": value}
    return value


def _refused_400(answer: bytes, word: str) -> dict[str, Any]:
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 "), answer[:300]
    doc: dict[str, Any] = json.loads(body)
    assert doc["code"] == "BAD_ADMISSION_REVIEW", doc
    assert word in doc["message"], doc
    return doc


def test_100000_deep_json_is_a_400_and_the_webhook_keeps_serving_fake_apiserver_client_cert(
    injector: Injector,
) -> None:
    context = injector.tls_context()
    deep = b"[" * 100_000 + b"]" * 100_000
    _refused_400(_exchange(injector, context, _post(deep)), "deeper than 64")
    deep_objects = b'{"a":' * 100_000 + b"1" + b"}" * 100_000
    _refused_400(_exchange(injector, context, _post(deep_objects)), "deeper than 64")
    # A review that is well-formed but nests its pod 70 levels deep: refused the same way.
    shaped = pod()
    shaped["spec"]["affinity"] = _nested(70)
    _refused_400(_exchange(injector, context, _post(json.dumps(review(shaped)).encode())), "64")
    # The server kept serving, and said nothing of a recursion or a traceback.
    with injector.client() as client:
        answer = client.post("/mutate", json=review(pod()))
    assert answer.status_code == 200 and patch_of(answer.json()) is not None
    log = injector.log.read_text()
    assert "Traceback" not in log and "RecursionError" not in log
    assert 'reason="malformed",result="refused"' in injector.metrics()


def test_an_oversized_body_is_refused_unread_fake_apiserver_client_cert(
    injector: Injector,
) -> None:
    head = (
        b"POST /mutate HTTP/1.1\r\nHost: injector\r\nContent-Type: application/json\r\n"
        b"Content-Length: " + str(2 * 1024 * 1024 + 1).encode() + b"\r\n\r\n"
    )
    answer = _exchange(injector, injector.tls_context(), head)  # no body sent: not awaited
    status, _, rest = answer.partition(b"\r\n")
    assert status.startswith(b"HTTP/1.1 413 "), answer[:200]
    body = json.loads(rest.partition(b"\r\n\r\n")[2])
    assert set(body) == {"code", "message", "details"}


@pytest.fixture(scope="module")
def named(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Injector]:
    """An injector that takes only the certificate named ``kube-apiserver``."""
    tmp = tmp_path_factory.mktemp("named")
    ca = CertificateAuthority(tmp)
    running = Injector(tmp, ca, ca.issue("injector"), "--client-name", APISERVER)
    running.service.start()
    yield running
    running.service.stop()


def test_client_name_narrows_who_the_ca_admits_fake_apiserver_client_cert(
    named: Injector,
) -> None:
    kubelet = named.ca.issue("system:node:worker-1", client=True)  # same CA, another name
    answer = _exchange(named, named.tls_context(kubelet), _post(json.dumps(review(pod())).encode()))
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 403 "), answer[:200]
    assert b"patch" not in body and json.loads(body)["code"] == "FORBIDDEN"
    with named.client() as client:
        ok = client.post("/mutate", json=review(pod()))
    assert ok.status_code == 200 and patch_of(ok.json()) is not None
