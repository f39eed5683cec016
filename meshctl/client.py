"""A small synchronous client of the management plane's REST API.

meshctl runs one command and exits, so a blocking client (``transport``, on
the standard library) is the simplest correct choice. It adds the bearer
token, turns every error answer into an ``ApiFailure`` (one line, an exit
code), and turns network failures into ``Exit.UNREACHABLE``. With
``verbose`` it logs each request line to stderr; headers are never logged,
so the token cannot leak that way.
"""

from __future__ import annotations

import json as jsonlib
import sys
from collections.abc import Iterator, Mapping
from typing import Any

from meshctl.config import Profile
from meshctl.errors import ApiFailure, Exit, MeshctlError
from meshctl.transport import Response, Transport, TransportError, TransportTimeout

USER_AGENT = "meshctl/0.1"
DEFAULT_TIMEOUT_S = 30.0


def verify_setting(profile: Profile) -> bool | str:
    """TLS verification: a CA bundle path, or False when the user opted out."""
    if profile.insecure_skip_verify:
        return False
    return profile.ca_file or True


def require_server(profile: Profile) -> str:
    if not profile.server:
        raise MeshctlError(
            f"profile {profile.name!r} has no server; run meshctl login --server URL "
            "or meshctl config set-profile --server URL",
            Exit.USAGE,
        )
    return profile.server.rstrip("/")


class ApiClient:
    """Requests against one profile's server with its credentials."""

    def __init__(
        self,
        profile: Profile,
        *,
        token: str | None = None,
        verbose: bool = False,
        timeout: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        self.base_url = require_server(profile)
        self.verbose = verbose
        headers = {"User-Agent": USER_AGENT, "Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self._http = Transport(verify=verify_setting(profile), timeout=timeout, headers=headers)

    def close(self) -> None:
        """Nothing to release: every request uses its own connection."""

    def __enter__(self) -> ApiClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, str] | None = None,
        form: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Any:
        """Send one request; return the decoded JSON body of a 2xx answer."""
        if self.verbose:
            query = "?" + "&".join(f"{k}={v}" for k, v in params.items()) if params else ""
            print(f"> {method} {path}{query}", file=sys.stderr)
        try:
            response = self._http.request(
                method, self.base_url + path, params=params, json=json, form=form, headers=headers
            )
        except TransportTimeout as exc:
            raise MeshctlError(
                f"the management plane at {self.base_url} did not answer in time; retry later",
                Exit.UNREACHABLE,
            ) from exc
        except TransportError as exc:
            raise MeshctlError(
                f"cannot reach the management plane at {self.base_url} ({exc}); check the "
                "server URL (meshctl config view) and your network",
                Exit.UNREACHABLE,
            ) from exc
        if self.verbose:
            print(f"< {response.status}", file=sys.stderr)
        try:
            body: Any = response.json() if response.content else {}
        except ValueError:
            body = None
        if response.status >= 400:
            raise ApiFailure.from_response(
                response.status, body, retry_after=response.header("retry-after")
            )
        if body is None:
            raise MeshctlError(
                f"{method} {path} answered {response.status} without JSON; is "
                f"{self.base_url} a meshplane management plane?",
                Exit.API_ERROR,
            )
        return body

    def stream(self, method: str, path: str, *, json: Any) -> Iterator[Any]:
        """The decoded NDJSON lines of a streaming answer; errors as for :meth:`request`."""
        if self.verbose:
            print(f"> {method} {path} (stream)", file=sys.stderr)
        try:
            for item in self._http.stream_lines(method, self.base_url + path, json=json):
                if isinstance(item, Response):
                    try:
                        body: Any = item.json()
                    except ValueError:
                        body = None
                    raise ApiFailure.from_response(item.status, body)
                if item.strip():
                    yield jsonlib.loads(item)
        except TransportError as exc:
            raise MeshctlError(
                f"the stream from the management plane at {self.base_url} failed ({exc})",
                Exit.UNREACHABLE,
            ) from exc

    def get(self, path: str, params: Mapping[str, str] | None = None) -> Any:
        return self.request("GET", path, params=params)

    def post(self, path: str, body: Any = None, params: Mapping[str, str] | None = None) -> Any:
        return self.request("POST", path, json=body if body is not None else {}, params=params)

    def put(self, path: str, body: Any) -> Any:
        return self.request("PUT", path, json=body)

    def delete(self, path: str, params: Mapping[str, str] | None = None) -> Any:
        return self.request("DELETE", path, params=params)
