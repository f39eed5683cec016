"""A minimal blocking HTTP/1.1 client on the standard library.

Why not httpx: importing httpx costs about half a second of CPU per run
(it pulls in its own CLI, rich and pygments), which doubles the start-up time
of every ``meshctl`` command. meshctl makes a handful of plain JSON or form
requests per run, never streams, never follows redirects (an API call that
is redirected is a misconfiguration, and following it could carry the bearer
token to another host), so ``http.client`` is enough. One command streams
(``meshctl proxy logs -f``): :meth:`Transport.stream_lines` yields its
answer line by line, waiting as long as the server keeps the stream open.

TLS verification is always on unless the profile opts out; a profile may
name its own CA bundle.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json as jsonlib
import ssl
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode, urlsplit


class TransportError(Exception):
    """The request did not get an HTTP answer (refused, reset, DNS, TLS)."""


class TransportTimeout(TransportError):
    """No answer within the timeout."""


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    headers: Mapping[str, str]
    content: bytes

    def json(self) -> Any:
        """The decoded JSON body; raises ValueError when it is not JSON."""
        return jsonlib.loads(self.content.decode("utf-8"))

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())


def basic_auth(username: str, password: str) -> str:
    """The ``Authorization`` value for HTTP Basic (RFC 7617, UTF-8)."""
    raw = f"{username}:{password}".encode()
    return "Basic " + base64.b64encode(raw).decode("ascii")


class Transport:
    """Sends requests to absolute URLs with one TLS setting and timeout."""

    def __init__(
        self,
        *,
        verify: bool | str = True,
        timeout: float = 30.0,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.timeout = timeout
        self.headers = dict(headers or {})
        if verify is False:
            context = ssl.create_default_context()
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        elif isinstance(verify, str):
            context = ssl.create_default_context(cafile=verify)
        else:
            context = ssl.create_default_context()
        self._tls = context

    def _connect(self, url: str) -> tuple[http.client.HTTPConnection, str]:
        parts = urlsplit(url)
        if parts.scheme not in {"http", "https"} or not parts.hostname:
            raise TransportError(f"not an http(s) URL: {url}")
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        if parts.scheme == "https":
            conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                parts.hostname, parts.port, timeout=self.timeout, context=self._tls
            )
        else:
            conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=self.timeout)
        return conn, target

    def stream_lines(self, method: str, url: str, *, json: Any) -> Iterator[Response | bytes]:
        """An error answer as a Response (first and only item), else the body's lines."""
        conn, target = self._connect(url)
        headers = {**self.headers, "Content-Type": "application/json"}
        with _failures(conn):
            conn.request(method, target, body=jsonlib.dumps(json).encode(), headers=headers)
            raw = conn.getresponse()
            if raw.status >= 400:
                yield Response(raw.status, {k.lower(): v for k, v in raw.getheaders()}, raw.read())
                return
            if conn.sock is not None:
                conn.sock.settimeout(None)  # a followed stream may be quiet for long
            while line := raw.readline():
                yield line

    def request(
        self,
        method: str,
        url: str,
        *,
        params: Mapping[str, str] | None = None,
        json: Any = None,
        form: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Response:
        if params:
            url += ("&" if urlsplit(url).query else "?") + urlencode(params)
        conn, target = self._connect(url)
        send_headers = {**self.headers, **(headers or {})}
        body: bytes | None = None
        if json is not None:
            body = jsonlib.dumps(json).encode()
            send_headers["Content-Type"] = "application/json"
        elif form is not None:
            body = urlencode(form).encode()
            send_headers["Content-Type"] = "application/x-www-form-urlencoded"
        with _failures(conn):
            conn.request(method, target, body=body, headers=send_headers)
            raw = conn.getresponse()
            content = raw.read()
            return Response(raw.status, {k.lower(): v for k, v in raw.getheaders()}, content)


@contextlib.contextmanager
def _failures(conn: http.client.HTTPConnection) -> Iterator[None]:
    """The connection's failures as TransportError (timeouts as TransportTimeout); closes it."""
    try:
        yield
    except TimeoutError as exc:
        raise TransportTimeout("timed out") from exc
    except ssl.SSLError as exc:
        raise TransportError(f"TLS failure: {exc.reason or exc}") from exc
    except (OSError, http.client.HTTPException) as exc:
        raise TransportError(f"{exc.__class__.__name__}: {exc}") from exc
    finally:
        conn.close()
