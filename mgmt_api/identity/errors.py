"""The errors of the identity package, each with a stable reason.

The REST layer maps them onto the one API error model: ``reason`` goes into
the error details, ``message`` is safe to show (it never holds a token, code
or secret). Suggested mapping: ``InvalidLoginError`` and
``TokenExchangeRefusedError`` → 401 UNAUTHENTICATED (403 PERMISSION_DENIED for
``client_not_allowed``), ``ProviderError`` → 503 UNAVAILABLE.
"""

from __future__ import annotations


class IdentityError(Exception):
    """Base class: ``reason`` is a short machine-readable code."""

    reason: str = "identity_error"
    return_to: str | None = None
    """Set by ``OidcLogin.complete`` once the failing callback's state was taken and
    found bound to this browser: where that login wanted the user sent back."""

    def __init__(self, message: str, *, reason: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if reason is not None:
            self.reason = reason


class ProviderError(IdentityError):
    """The identity provider could not be reached or answered nonsense."""

    reason = "provider_unavailable"


class InvalidTokenError(IdentityError):
    """A token failed signature or claim validation."""

    reason = "invalid_token"


class InvalidLoginError(IdentityError):
    """A callback that cannot complete a login (bad or replayed state, provider error...)."""

    reason = "invalid_login"


class TokenExchangeRefusedError(IdentityError):
    """A token exchange request that the rules of spec section 5 refuse."""

    reason = "token_exchange_refused"
