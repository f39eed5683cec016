"""The OIDC authorization-code flow with ``state``, ``nonce`` and PKCE.

Seams for the REST layer (``GET /v2/oidc[/{name}]/login`` and ``/callback``):

* ``OidcLogin.begin(return_to, code_challenge=...)`` → ``LoginStart``:
  redirect the browser to ``authorization_url`` and set the login cookie
  (HttpOnly, SameSite=Lax, path and ``Secure`` from the configured
  ``redirectUri``) to ``browser_binding``, a random value the pending login
  knows only by its digest.
* ``OidcLogin.complete(callback, browser_binding=cookie, find_user=...)`` →
  ``LoginResult``; the REST layer then mints the session token, or, when the
  login has a ``return_to``, a one-time code for it (``login_code``).
  ``ProviderLoginError`` carries the provider's ``error`` triple for
  ``error_page.render_error_page``; any other ``IdentityError`` is a failed
  login (render a generic error page, no session).

``find_user`` is the user store's callable: it gets the verified identity
(``sub``, email, issuer) and returns the user record or ``None``. Users must
exist (created by sync or an admin): there is no just-in-time creation.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar
from urllib.parse import quote, urlencode

import httpx

from mgmt_api.identity.claims import DEFAULT_LEEWAY_S, check_id_token
from mgmt_api.identity.config import OidcConfig
from mgmt_api.identity.discovery import DiscoveryCache, ProviderMetadata
from mgmt_api.identity.errors import (
    IdentityError,
    InvalidLoginError,
    InvalidTokenError,
    ProviderError,
)
from mgmt_api.identity.jwks import DEFAULT_ALLOWED_ALGS, ProviderKeys, verify_jwt
from mgmt_api.identity.login_state import (
    DEFAULT_LOGIN_TTL_S,
    LoginState,
    LoginStateStore,
    new_browser_binding,
)
from mgmt_api.identity.pkce import (
    code_challenge_s256,
    is_s256_challenge,
    new_code_verifier,
    new_random_token,
)
from mgmt_api.identity.redirects import is_safe_return_to
from mgmt_api.identity.secrets import SecretUnavailableError

U = TypeVar("U")


@dataclass(frozen=True, slots=True)
class LoginStart:
    authorization_url: str = field(repr=False)
    state: str = field(repr=False)
    browser_binding: str = field(repr=False)
    """The login cookie's value: random, independent of ``state``, stored only hashed."""
    expires_at: float


@dataclass(frozen=True, slots=True)
class CallbackParams:
    """The callback's query parameters (the REST layer accepts both the spec's
    camelCase ``errorDescription``/``errorUri`` and RFC 6749's snake_case)."""

    state: str | None
    code: str | None = field(default=None, repr=False)
    error: str | None = None
    error_description: str | None = None
    error_uri: str | None = None

    @classmethod
    def from_query(cls, query: Mapping[str, str]) -> CallbackParams:
        def pick(*names: str) -> str | None:
            return next((query[n] for n in names if query.get(n)), None)

        return cls(
            state=pick("state"),
            code=pick("code"),
            error=pick("error"),
            error_description=pick("errorDescription", "error_description"),
            error_uri=pick("errorUri", "error_uri"),
        )


class ProviderLoginError(InvalidLoginError):
    """The provider sent the user back with an error; show it (escaped) to the user."""

    reason = "provider_error"

    def __init__(self, error: str, description: str | None, uri: str | None) -> None:
        super().__init__(f"the identity provider refused the login: {error}")
        self.error = error
        self.description = description
        self.uri = uri


@dataclass(frozen=True, slots=True)
class VerifiedIdentity:
    """Who the ID token says logged in, after every check passed."""

    issuer: str
    subject: str
    email: str | None
    email_verified: bool
    name: str | None
    claims: Mapping[str, Any] = field(repr=False)


@dataclass(frozen=True, slots=True)
class ProviderTokens:
    """A token endpoint response. Tokens are kept out of ``repr``."""

    access_token: str = field(repr=False)
    token_type: str
    id_token: str | None = field(default=None, repr=False)
    refresh_token: str | None = field(default=None, repr=False)
    expires_in: int | None = None
    scope: str | None = None

    @classmethod
    def from_response(cls, body: Any) -> ProviderTokens:
        if not isinstance(body, Mapping) or not isinstance(body.get("access_token"), str):
            raise ProviderError("the token endpoint answered without an access_token")
        expires = body.get("expires_in")
        return cls(
            access_token=body["access_token"],
            token_type=str(body.get("token_type", "Bearer")),
            id_token=body.get("id_token") if isinstance(body.get("id_token"), str) else None,
            refresh_token=body.get("refresh_token")
            if isinstance(body.get("refresh_token"), str)
            else None,
            expires_in=int(expires) if isinstance(expires, int | float) else None,
            scope=body.get("scope") if isinstance(body.get("scope"), str) else None,
        )


@dataclass(frozen=True, slots=True)
class LoginResult(Generic[U]):
    user: U
    identity: VerifiedIdentity
    config_name: str
    return_to: str | None
    client_challenge: str | None = None
    """The PKCE challenge the client behind ``return_to`` sent with the login."""


FindUser = Callable[[VerifiedIdentity], Awaitable[U | None]]


def client_auth(method: str, client_id: str, secret: str, form: dict[str, str]) -> dict[str, str]:
    """Headers for the token request; adds the credentials to ``form`` for ``_post``.

    For Basic, RFC 6749 2.3.1 wants id and secret form-urlencoded before
    base64: a secret with ``:`` or ``%`` breaks naive implementations.
    """
    if method == "client_secret_post":
        form["client_id"] = client_id
        form["client_secret"] = secret
        return {}
    pair = f"{quote(client_id, safe='')}:{quote(secret, safe='')}"
    return {"Authorization": "Basic " + base64.b64encode(pair.encode()).decode()}


async def post_token_request(
    http: httpx.AsyncClient, token_endpoint: str, form: dict[str, str], headers: dict[str, str]
) -> ProviderTokens:
    """POST to a token endpoint; OAuth errors become ``InvalidLoginError`` with the code.

    The response body is never logged or echoed beyond the error code and
    description: it may hold tokens.
    """
    try:
        response = await http.post(
            token_endpoint, data=form, headers={"Accept": "application/json", **headers}
        )
    except httpx.HTTPError as exc:
        raise ProviderError(f"cannot reach the token endpoint: {exc.__class__.__name__}") from exc
    try:
        body = response.json()
    except ValueError as exc:
        raise ProviderError(f"the token endpoint answered HTTP {response.status_code}") from exc
    if response.status_code >= 400 or (isinstance(body, Mapping) and "error" in body):
        error = str(body.get("error", "invalid_response")) if isinstance(body, Mapping) else "?"
        raise InvalidLoginError(
            f"the identity provider refused the token request: {error}", reason=error
        )
    return ProviderTokens.from_response(body)


class OidcLogin:
    """One named OIDC configuration: starts logins and completes callbacks."""

    def __init__(
        self,
        config: OidcConfig,
        *,
        http: httpx.AsyncClient,
        discovery: DiscoveryCache,
        states: LoginStateStore,
        clock: Callable[[], float] = time.time,
        login_ttl_s: float = DEFAULT_LOGIN_TTL_S,
        leeway_s: float = DEFAULT_LEEWAY_S,
        allowed_return_origins: tuple[str, ...] = (),
        keys: ProviderKeys | None = None,
    ) -> None:
        self.config = config
        self._http = http
        self._discovery = discovery
        self._states = states
        self._clock = clock
        self._ttl = login_ttl_s
        self._leeway = leeway_s
        self._return_origins = allowed_return_origins
        self.keys = keys or ProviderKeys(http)
        """The JWKS cache of this configuration (shared with its ``TokenExchanger``)."""

    async def metadata(self) -> ProviderMetadata:
        return await self._discovery.get(self.config.configuration_uri)

    async def begin(
        self,
        return_to: str | None = None,
        *,
        code_challenge: str | None = None,
        code_challenge_method: str | None = None,
    ) -> LoginStart:
        """Create a pending login and the provider URL to send the browser to.

        A ``return_to`` needs the client's own PKCE ``code_challenge`` (S256):
        what is sent there is a one-time code that only the holder of the
        matching verifier can redeem, never the session token (RFC 8252).
        """
        if return_to is not None and not is_safe_return_to(return_to, self._return_origins):
            raise InvalidLoginError(
                "redirectUri must be a path on this server, an allowed origin, or a loopback "
                "URL with a literal IP address (http://127.0.0.1:PORT/... or http://[::1]:PORT/...)",
                reason="invalid_redirect_uri",
            )
        if code_challenge is not None or code_challenge_method is not None:
            if return_to is None:
                raise InvalidLoginError(
                    "codeChallenge is only used with a redirectUri", reason="invalid_request"
                )
            if code_challenge_method != "S256" or not is_s256_challenge(code_challenge or ""):
                raise InvalidLoginError(
                    "codeChallenge must be an S256 PKCE challenge (43 base64url characters) "
                    "and codeChallengeMethod must be S256",
                    reason="invalid_code_challenge",
                )
        elif return_to is not None:
            raise InvalidLoginError(
                "a login with a redirectUri needs the client's PKCE codeChallenge "
                "(codeChallengeMethod=S256): the redirect carries a one-time code that the "
                "client redeems with its verifier at POST /v2/oidc/token",
                reason="code_challenge_required",
            )
        metadata = await self.metadata()
        now = self._clock()
        binding, binding_hash = new_browser_binding()
        login = LoginState(
            state=new_random_token(),
            config_name=self.config.name,
            nonce=new_random_token(),
            code_verifier=new_code_verifier(),
            redirect_uri=self.config.redirect_uri,
            return_to=return_to,
            created_at=now,
            expires_at=now + self._ttl,
            binding_hash=binding_hash,
            client_challenge=code_challenge,
        )
        self._states.put(login)
        query = urlencode(
            {
                "response_type": "code",
                "client_id": self.config.client_id,
                "redirect_uri": login.redirect_uri,
                "scope": " ".join(self.config.request_scopes),
                "state": login.state,
                "nonce": login.nonce,
                "code_challenge": code_challenge_s256(login.code_verifier),
                "code_challenge_method": "S256",
                # OIDC Core 11: offline_access is only honoured with prompt=consent.
                **({"prompt": "consent"} if "offline_access" in self.config.scopes else {}),
            }
        )
        separator = "&" if "?" in metadata.authorization_endpoint else "?"
        return LoginStart(
            authorization_url=f"{metadata.authorization_endpoint}{separator}{query}",
            state=login.state,
            browser_binding=binding,
            expires_at=login.expires_at,
        )

    async def complete(
        self,
        callback: CallbackParams,
        *,
        browser_binding: str | None,
        find_user: FindUser[U],
    ) -> LoginResult[U]:
        """Finish a login from the callback's parameters.

        The state is consumed first, whatever else the callback carries, so
        it can never be used twice, not even after a provider error.
        """
        if not callback.state:
            raise InvalidLoginError("the callback has no state parameter", reason="missing_state")
        login = self._states.take(callback.state, self._clock())
        if login is None:
            raise InvalidLoginError(
                "this login link has expired or was already used; start the login again",
                reason="unknown_state",
            )
        if login.config_name != self.config.name:
            raise InvalidLoginError(
                "the callback does not belong to this OIDC configuration", reason="wrong_config"
            )
        if not login.bound_to(browser_binding):
            raise InvalidLoginError(
                "the login was started in another browser; start the login again",
                reason="state_not_bound",
            )
        try:
            return await self._finish(callback, login, find_user)
        except IdentityError as exc:
            # The login is genuinely this browser's: its client may be told why it failed.
            exc.return_to = login.return_to
            raise

    async def _finish(
        self, callback: CallbackParams, login: LoginState, find_user: FindUser[U]
    ) -> LoginResult[U]:
        if callback.error:
            raise ProviderLoginError(callback.error, callback.error_description, callback.error_uri)
        if not callback.code:
            raise InvalidLoginError(
                "the callback has neither code nor error", reason="missing_code"
            )
        tokens = await self.exchange_code(callback.code, login)
        if tokens.id_token is None:
            raise InvalidLoginError("the provider returned no ID token", reason="missing_id_token")
        identity = await self.verify_id_token(tokens.id_token, nonce=login.nonce)
        user = await find_user(identity)
        if user is None:
            raise InvalidLoginError(
                "there is no user for this account; ask an administrator, or wait for the "
                "next directory sync",
                reason="unknown_user",
            )
        return LoginResult(
            user=user,
            identity=identity,
            config_name=self.config.name,
            return_to=login.return_to,
            client_challenge=login.client_challenge,
        )

    async def exchange_code(self, code: str, login: LoginState) -> ProviderTokens:
        """Redeem the authorization code with the PKCE verifier (RFC 6749 4.1.3, RFC 7636 4.5)."""
        metadata = await self.metadata()
        form = {
            "grant_type": "authorization_code",
            "code": code,
            "redirect_uri": login.redirect_uri,
            "code_verifier": login.code_verifier,
        }
        try:
            secret = self.config.client_secret.read()
        except SecretUnavailableError as exc:
            # The state is already consumed: say clearly that the fault is ours, not the
            # user's, and that retrying is pointless until an operator fixes it.
            raise ProviderError(
                "the management plane cannot read its OIDC client secret "
                f"({self.config.client_secret.describe()}); ask an administrator",
                reason="client_secret_unavailable",
            ) from exc
        headers = client_auth(
            metadata.token_auth_method(), self.config.client_id, secret.reveal(), form
        )
        return await post_token_request(self._http, metadata.token_endpoint, form, headers)

    async def verify_id_token(
        self, id_token: str, *, nonce: str | None, audience: str | None = None
    ) -> VerifiedIdentity:
        """Signature (JWKS), ``iss``, ``aud``, ``exp``/``iat`` with leeway, and ``nonce``.

        ``audience`` defaults to the web client id; the device-code login
        passes ``deviceCodeAuth.clientId`` and no nonce.
        """
        metadata = await self.metadata()
        allowed = DEFAULT_ALLOWED_ALGS
        if metadata.id_token_signing_algs:
            allowed = allowed & frozenset(metadata.id_token_signing_algs)
        claims = await verify_jwt(
            id_token, self.keys.for_uri(metadata.jwks_uri), allowed_algs=allowed
        )
        subject = check_id_token(
            claims,
            issuer=metadata.issuer,
            client_id=audience or self.config.client_id,
            nonce=nonce,
            now=self._clock(),
            leeway=self._leeway,
        )
        email = claims.get("email")
        name = claims.get("name")
        return VerifiedIdentity(
            issuer=metadata.issuer,
            subject=subject,
            email=email if isinstance(email, str) else None,
            email_verified=claims.get("email_verified") is True,
            name=name if isinstance(name, str) else None,
            claims=claims,
        )

    async def verify_device_login(self, id_token: str) -> VerifiedIdentity:
        """An ID token that ``meshctl`` obtained with the device flow."""
        if self.config.device_code_client_id is None:
            raise InvalidTokenError(
                "device-code login is not configured", reason="device_code_disabled"
            )
        return await self.verify_id_token(
            id_token, nonce=None, audience=self.config.device_code_client_id
        )
