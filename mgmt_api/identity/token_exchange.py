"""Server-side rules of token-exchange login (RFC 8693; spec section 5).

``meshctl login --use-token-exchange --access-token T`` posts ``T`` (an
access token the identity provider issued to a service principal) to the
management plane, which answers with a temporary platform token. The rules:

1. the token is signed by the provider (its JWKS), ``iss`` is the
   provider's issuer, ``exp`` has not passed;
2. it is a **version 2.0** access token (``ver == "2.0"``);
3. its ``aud`` names the management plane (``tokenExchange.audience``,
   by default ``api://<clientId>`` or ``<clientId>`` of the configuration):
   a token the provider issued for another API must not be replayable here;
4. its client id (``azp``; ``appid`` on older shapes) equals
   ``offlineAccessConfig.tokenExchange.clientId``;
5. a user record exists whose ID equals the token's ``sub`` (for a service
   principal the subject is the client id itself).

The platform token never outlives the provider token (``mint`` gets the
token's ``exp`` in ``ExchangeSubject.expires_at``), so revoking or
shortening the provider credential bounds the platform session too.

Why refuse version 1.0: Entra ID issues v1 access tokens unless the app's
manifest says ``accessTokenAcceptedVersion: 2``. A v1 token has
``ver: "1.0"``, the issuer ``https://sts.windows.net/{tenant}/`` instead of
``https://login.microsoftonline.com/{tenant}/v2.0``, and ``appid`` instead
of ``azp``; it does not match the discovery document's issuer, so rather
than fail with a confusing issuer mismatch we say what to change.

Seam: ``TokenExchanger.exchange(form, find_user=..., mint=...)`` returns
the RFC 8693 JSON body; ``mint`` is the platform token service.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, NotRequired, TypedDict, TypeVar

import httpx

from mgmt_api.identity.claims import DEFAULT_LEEWAY_S, check_time
from mgmt_api.identity.claims import audiences as token_audiences
from mgmt_api.identity.config import OidcConfig
from mgmt_api.identity.discovery import DiscoveryCache
from mgmt_api.identity.errors import InvalidTokenError, TokenExchangeRefusedError
from mgmt_api.identity.jwks import ProviderKeys, verify_jwt

P = TypeVar("P")

TOKEN_EXCHANGE_GRANT = "urn:ietf:params:oauth:grant-type:token-exchange"  # noqa: S105 - a URN, not a secret
ACCESS_TOKEN_TYPE = "urn:ietf:params:oauth:token-type:access_token"  # noqa: S105 - a URN, not a secret
JWT_TOKEN_TYPE = "urn:ietf:params:oauth:token-type:jwt"  # noqa: S105 - a URN, not a secret
ID_TOKEN_TYPE = "urn:ietf:params:oauth:token-type:id_token"  # noqa: S105 - a URN, not a secret
ACCEPTED_SUBJECT_TOKEN_TYPES = frozenset({ACCESS_TOKEN_TYPE, JWT_TOKEN_TYPE})

V1_REFUSAL = (
    "this is a version 1.0 access token; token exchange accepts only version 2.0 access "
    "tokens: set accessTokenAcceptedVersion to 2 in the identity provider app's manifest"
)


class TokenExchangeRequestError(Exception):
    """A malformed RFC 8693 request; ``error`` is the OAuth error code for the response."""

    def __init__(self, error: str, message: str) -> None:
        super().__init__(message)
        self.error = error
        self.message = message


@dataclass(frozen=True, slots=True)
class TokenExchangeRequest:
    subject_token: str = field(repr=False)
    subject_token_type: str


def parse_token_exchange_request(
    form: Mapping[str, str], accepted_types: frozenset[str] = ACCEPTED_SUBJECT_TOKEN_TYPES
) -> TokenExchangeRequest:
    """Validate the form of an RFC 8693 token request (section 2.1).

    ``accepted_types`` are the subject token types this grant takes: provider
    access tokens for token exchange, ``ID_TOKEN_TYPE`` for the device login.
    """
    if form.get("grant_type") != TOKEN_EXCHANGE_GRANT:
        raise TokenExchangeRequestError(
            "unsupported_grant_type", f"grant_type must be {TOKEN_EXCHANGE_GRANT}"
        )
    token = form.get("subject_token")
    if not token:
        raise TokenExchangeRequestError("invalid_request", "subject_token is required")
    token_type = form.get("subject_token_type")
    if token_type not in accepted_types:
        raise TokenExchangeRequestError(
            "invalid_request", f"subject_token_type must be {min(accepted_types)}"
        )
    requested = form.get("requested_token_type")
    if requested not in (None, "", ACCESS_TOKEN_TYPE):
        raise TokenExchangeRequestError(
            "invalid_target", f"only {ACCESS_TOKEN_TYPE} can be requested"
        )
    if form.get("actor_token"):
        raise TokenExchangeRequestError(
            "invalid_request", "delegation (actor_token) is not supported"
        )
    return TokenExchangeRequest(subject_token=token, subject_token_type=token_type)


@dataclass(frozen=True, slots=True)
class ExchangeSubject:
    """Who the provider token speaks for, once every rule passed."""

    subject: str
    client_id: str
    issuer: str
    claims: Mapping[str, Any] = field(repr=False)
    expires_at: float = 0.0
    """The provider token's ``exp``: the platform token must not outlive it."""


def check_exchange_claims(
    claims: Mapping[str, Any],
    *,
    issuer: str,
    allowed_client_id: str,
    now: float,
    leeway: float = DEFAULT_LEEWAY_S,
    audiences: Collection[str] | None = None,
) -> ExchangeSubject:
    """Rules 1 to 4 on signature-verified claims (pure; rule 5 needs the user store).

    ``audiences``: the token's ``aud`` must name one of them (``None`` skips
    the check; the server always passes the configured audiences).
    """
    version = claims.get("ver")
    if version == "1.0" or (version is None and "appid" in claims and "azp" not in claims):
        raise TokenExchangeRefusedError(V1_REFUSAL, reason="token_version_1")
    if version != "2.0":
        raise TokenExchangeRefusedError(
            f"the access token's version is {version!r}; only version 2.0 is accepted",
            reason="token_version_unsupported",
        )
    if claims.get("iss") != issuer:
        raise TokenExchangeRefusedError(
            "the access token was not issued by the configured identity provider",
            reason="wrong_issuer",
        )
    try:
        check_time(claims, now=now, leeway=leeway)
    except InvalidTokenError as exc:
        raise TokenExchangeRefusedError(exc.message, reason=exc.reason) from exc
    if audiences is not None and not set(audiences) & set(token_audiences(claims)):
        raise TokenExchangeRefusedError(
            "the access token is not meant for the management plane: its audience must be "
            f"one of {', '.join(sorted(audiences))} (offlineAccessConfig.tokenExchange.audience)",
            reason="wrong_audience",
        )
    client_id = claims.get("azp") or claims.get("appid")
    if not isinstance(client_id, str) or client_id != allowed_client_id:
        raise TokenExchangeRefusedError(
            "token exchange is allowed only for the configured client; this token was issued "
            "to another client",
            reason="client_not_allowed",
        )
    subject = claims.get("sub")
    if not isinstance(subject, str) or not subject:
        raise TokenExchangeRefusedError("the access token has no subject", reason="missing_sub")
    return ExchangeSubject(
        subject=subject,
        client_id=client_id,
        issuer=issuer,
        claims=claims,
        expires_at=float(claims["exp"]),
    )


@dataclass(frozen=True, slots=True)
class IssuedToken:
    """What the platform token service minted."""

    access_token: str = field(repr=False)
    expires_in: int


class TokenBody(TypedDict):
    """A platform token as the token endpoint answers it (RFC 6749 5.1; RFC 8693 2.2.1
    adds ``issued_token_type``)."""

    access_token: str
    issued_token_type: NotRequired[str]
    token_type: str
    expires_in: int


def token_exchange_response(issued: IssuedToken) -> TokenBody:
    """The RFC 8693 2.2.1 success body."""
    return {
        "access_token": issued.access_token,
        "issued_token_type": ACCESS_TOKEN_TYPE,
        "token_type": "Bearer",
        "expires_in": issued.expires_in,
    }


class TokenExchanger(Generic[P]):
    """Token-exchange login for one OIDC configuration."""

    def __init__(
        self,
        config: OidcConfig,
        *,
        http: httpx.AsyncClient,
        discovery: DiscoveryCache,
        clock: Callable[[], float] = time.time,
        leeway_s: float = DEFAULT_LEEWAY_S,
        keys: ProviderKeys | None = None,
    ) -> None:
        self.config = config
        self._http = http
        self._discovery = discovery
        self._clock = clock
        self._leeway = leeway_s
        self.keys = keys or ProviderKeys(http)
        """The JWKS cache of this configuration (shared with its ``OidcLogin``)."""

    @property
    def enabled(self) -> bool:
        return self.config.token_exchange_client_id is not None

    async def verify(self, subject_token: str) -> ExchangeSubject:
        """Rules 1 to 4: the token itself."""
        allowed_client = self.config.token_exchange_client_id
        if allowed_client is None:
            raise TokenExchangeRefusedError(
                "token exchange is not configured", reason="token_exchange_disabled"
            )
        metadata = await self._discovery.get(self.config.configuration_uri)
        try:
            claims = await verify_jwt(subject_token, self.keys.for_uri(metadata.jwks_uri))
        except InvalidTokenError as exc:
            raise TokenExchangeRefusedError(exc.message, reason=exc.reason) from exc
        return check_exchange_claims(
            claims,
            issuer=metadata.issuer,
            allowed_client_id=allowed_client,
            now=self._clock(),
            leeway=self._leeway,
            audiences=self.config.token_exchange_audiences,
        )

    async def exchange(
        self,
        form: Mapping[str, str],
        *,
        find_user: Callable[[str], Awaitable[P | None]],
        mint: Callable[[P, ExchangeSubject], Awaitable[IssuedToken]],
    ) -> TokenBody:
        """The whole exchange: parse, verify, look the user up (rule 5), mint."""
        request = parse_token_exchange_request(form)
        subject = await self.verify(request.subject_token)
        principal = await find_user(subject.subject)
        if principal is None:
            raise TokenExchangeRefusedError(
                f"no user record has the ID {subject.subject!r} (the token's subject); "
                "create it or sync it from the directory first",
                reason="unknown_user",
            )
        return token_exchange_response(await mint(principal, subject))
