"""The page a user sees when the provider sends them back with an error.

Everything in it comes from query parameters, i.e. from whoever crafted the
link, so every value is HTML-escaped, and ``errorUri`` becomes a link only if
it is an absolute http(s) URL (a ``javascript:`` or ``data:`` URI is shown as
text). The page has no script and a CSP that forbids any.
"""

from __future__ import annotations

import html
from urllib.parse import urlsplit

CONTENT_SECURITY_POLICY = "default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'"
MAX_FIELD_CHARS = 2000

_KNOWN_ERRORS = {
    "access_denied": "You (or the identity provider) declined the sign-in.",
    "login_required": "The identity provider needs you to sign in again.",
    "consent_required": "The identity provider needs your consent for this application.",
    "interaction_required": "The identity provider needs you to interact with it.",
    "invalid_request": "The sign-in request was not valid.",
    "unauthorized_client": "This application may not sign in this way.",
    "server_error": "The identity provider had an internal error.",
    "temporarily_unavailable": "The identity provider is temporarily unavailable.",
}


def _clip(value: str) -> str:
    return value if len(value) <= MAX_FIELD_CHARS else value[:MAX_FIELD_CHARS] + "…"


def safe_link(uri: str | None) -> str | None:
    """``uri`` if it is an absolute http(s) URL, else ``None``."""
    if not uri:
        return None
    parts = urlsplit(uri.strip())
    if parts.scheme.lower() in {"http", "https"} and parts.netloc:
        return uri.strip()
    return None


def render_error_page(
    error: str | None,
    error_description: str | None = None,
    error_uri: str | None = None,
    *,
    retry_url: str | None = "/v2/oidc/login",
) -> str:
    """A complete, static HTML page explaining the failed sign-in."""
    code = _clip(error or "unknown_error")
    summary = _KNOWN_ERRORS.get(code, "The sign-in did not complete.")
    rows = [f"<p>{html.escape(summary)}</p>", f"<p>Error: <code>{html.escape(code)}</code></p>"]
    if error_description:
        rows.append(f"<p>Details: {html.escape(_clip(error_description))}</p>")
    if error_uri:
        link = safe_link(error_uri)
        if link is not None:
            href = html.escape(link, quote=True)
            rows.append(
                f'<p>More information: <a href="{href}" rel="noopener noreferrer">'
                f"{html.escape(_clip(link))}</a></p>"
            )
        else:
            rows.append(f"<p>More information: {html.escape(_clip(error_uri))}</p>")
    if retry_url:
        rows.append(
            f'<p><a href="{html.escape(retry_url, quote=True)}">Try signing in again</a></p>'
        )
    body = "\n    ".join(rows)
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en">\n<head>\n  <meta charset="utf-8">\n'
        "  <title>Sign-in failed</title>\n"
        '  <meta name="robots" content="noindex">\n'
        "  <style>body{font-family:sans-serif;max-width:40em;margin:3em auto}</style>\n"
        "</head>\n<body>\n  <h1>Sign-in failed</h1>\n    "
        f"{body}\n</body>\n</html>\n"
    )
