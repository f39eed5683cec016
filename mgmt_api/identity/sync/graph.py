"""Microsoft Graph as a directory source (client credentials, paging, throttling).

* Token: the client-credentials grant at
  ``{authority}/{tenant}/oauth2/v2.0/token`` with scope
  ``{graph}/.default``; the app needs the ``Directory.Read.All``
  application permission with admin consent. The token is cached until a
  minute before it expires, and refreshed once on a 401.
* Listing: ``/v1.0/users``, ``/v1.0/groups`` and
  ``/v1.0/groups/{id}/members`` with ``$select`` and ``$top=999``, following
  ``@odata.nextLink`` until it is absent. A next link must stay on the Graph
  host: we would otherwise send our bearer token wherever a response says.
* Throttling: on 429, 503 or 504 Graph sends ``Retry-After`` (seconds). We
  wait that long, up to ``max_retry_after_s`` per wait and ``max_retries``
  per request; beyond the bound the run fails (and applies nothing) rather
  than hang the sync job for an unbounded time.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

import httpx

from mgmt_api.identity.config import AzureSyncConfig
from mgmt_api.identity.secrets import SecretUnavailableError
from mgmt_api.identity.sync.model import DirectoryTeam, DirectoryUser
from mgmt_api.identity.sync.runner import SourceError

THROTTLE_STATUSES = frozenset({429, 503, 504})
PAGE_SIZE = 999
USER_TYPE = "#microsoft.graph.user"
GROUP_TYPE = "#microsoft.graph.group"


def parse_retry_after(value: str | None, default: float) -> float:
    """``Retry-After`` in seconds; Graph sends delta-seconds. Unparseable → ``default``."""
    if value is None:
        return default
    try:
        seconds = float(value.strip())
    except ValueError:
        return default
    return max(seconds, 0.0)


class GraphSource:
    """Users and groups of one Entra ID tenant."""

    source_type = "AZURE"

    def __init__(
        self,
        config: AzureSyncConfig,
        http: httpx.AsyncClient,
        *,
        max_retries: int = 5,
        max_retry_after_s: float = 120.0,
        default_retry_after_s: float = 2.0,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self._http = http
        self._max_retries = max_retries
        self._max_wait = max_retry_after_s
        self._default_wait = default_retry_after_s
        self._sleep = sleep
        self._clock = clock
        self._token: str | None = None
        self._token_expires = 0.0
        self.throttle_waits: list[float] = []
        graph = urlsplit(config.graph_base_url)
        self._graph_origin = (graph.scheme, graph.netloc)

    async def _access_token(self, *, force: bool = False) -> str:
        if not force and self._token is not None and self._clock() < self._token_expires:
            return self._token
        url = f"{self.config.authority_base_url}/{self.config.tenant_id}/oauth2/v2.0/token"
        try:
            secret = self.config.client_secret.read()
        except SecretUnavailableError as exc:
            raise SourceError(f"cannot read the Graph client secret: {exc}") from exc
        form = {
            "grant_type": "client_credentials",
            "client_id": self.config.client_id,
            "client_secret": secret.reveal(),
            "scope": f"{self.config.graph_base_url}/.default",
        }
        response = await self._send("POST", url, data=form)
        body = _json(response)
        if response.status_code >= 400 or not isinstance(body.get("access_token"), str):
            raise SourceError(
                f"the token request for Graph failed: HTTP {response.status_code} "
                f"{body.get('error', '')}".strip()
            )
        expires_in = body.get("expires_in", 3600)
        lifetime = float(expires_in) if isinstance(expires_in, int | float | str) else 3600.0
        self._token = str(body["access_token"])
        self._token_expires = self._clock() + max(lifetime - 60.0, 0.0)
        return self._token

    async def _send(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        """One request with the throttling rules; transport errors become ``SourceError``."""
        for attempt in range(self._max_retries + 1):
            try:
                response = await self._http.request(method, url, **kwargs)
            except httpx.HTTPError as exc:
                raise SourceError(
                    f"cannot reach {urlsplit(url).netloc}: {exc.__class__.__name__}"
                ) from exc
            if response.status_code not in THROTTLE_STATUSES:
                return response
            wait = parse_retry_after(response.headers.get("Retry-After"), self._default_wait)
            if wait > self._max_wait:
                raise SourceError(
                    f"Graph asked to retry after {wait:g}s, more than the {self._max_wait:g}s bound"
                )
            if attempt == self._max_retries:
                break
            self.throttle_waits.append(wait)
            await self._sleep(wait)
        raise SourceError(
            f"Graph kept answering HTTP {response.status_code} after {self._max_retries} retries"
        )

    async def _get_pages(self, url: str) -> AsyncIterator[Mapping[str, Any]]:
        next_url: str | None = url
        refreshed = False
        while next_url is not None:
            parts = urlsplit(next_url)
            if (parts.scheme, parts.netloc) != self._graph_origin:
                raise SourceError(
                    "Graph returned a next link to another host; refusing to follow it"
                )
            token = await self._access_token()
            response = await self._send(
                "GET",
                next_url,
                headers={"Authorization": f"Bearer {token}", "Accept": "application/json"},
            )
            if response.status_code == 401 and not refreshed:
                refreshed = True
                await self._access_token(force=True)
                continue
            if response.status_code >= 400:
                body = _json(response)
                error = body.get("error")
                code = error.get("code", "") if isinstance(error, Mapping) else ""
                raise SourceError(f"Graph answered HTTP {response.status_code} {code}".strip())
            body = _json(response)
            values = body.get("value")
            if not isinstance(values, list):
                raise SourceError("a Graph page has no 'value' list")
            for item in values:
                if isinstance(item, Mapping):
                    yield item
            link = body.get("@odata.nextLink")
            next_url = link if isinstance(link, str) and link else None

    def _url(self, path: str, select: str) -> str:
        return f"{self.config.graph_base_url}/v1.0{path}?$select={select}&$top={PAGE_SIZE}"

    async def fetch(self) -> tuple[list[DirectoryUser], list[DirectoryTeam]]:
        users: list[DirectoryUser] = []
        async for item in self._get_pages(
            self._url("/users", "id,userPrincipalName,mail,displayName")
        ):
            uid = item.get("id")
            if not isinstance(uid, str):
                continue
            upn = item.get("userPrincipalName")
            users.append(
                DirectoryUser(
                    id=uid,
                    login_name=upn if isinstance(upn, str) else uid,
                    email=_opt(item.get("mail")),
                    display_name=_opt(item.get("displayName")),
                )
            )
        groups: list[Mapping[str, Any]] = [
            g
            async for g in self._get_pages(self._url("/groups", "id,displayName,description"))
            if isinstance(g.get("id"), str)
        ]
        teams: list[DirectoryTeam] = []
        for group in groups:
            gid = str(group["id"])
            member_users: set[str] = set()
            member_groups: set[str] = set()
            async for member in self._get_pages(self._url(f"/groups/{gid}/members", "id")):
                mid = member.get("id")
                if not isinstance(mid, str):
                    continue
                kind = member.get("@odata.type")
                if kind == USER_TYPE:
                    member_users.add(mid)
                elif kind == GROUP_TYPE:
                    member_groups.add(mid)
            teams.append(
                DirectoryTeam(
                    id=gid,
                    display_name=_opt(group.get("displayName")),
                    description=_opt(group.get("description")),
                    member_user_ids=frozenset(member_users),
                    member_team_ids=frozenset(member_groups),
                )
            )
        return users, teams


def _opt(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _json(response: httpx.Response) -> Mapping[str, Any]:
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, Mapping) else {}
