"""Secrets never leave the cluster: the redaction every diagnostics answer passes.

Envoy already hides the fields its protos mark sensitive (TLS private keys,
SDS generic secrets) as ``[redacted]``. It cannot know what hides in
free-form places: node and cluster metadata (which ``/server_info`` carries
too), header values a route adds, inline strings of filters it does not
annotate, its own debug log lines. So the agent redacts every answer again,
by rules that do not depend on the Envoy version. :mod:`agent.replies` is the
one path answers leave by, and it calls :func:`redact` (JSON answers) and
:func:`redact_text` (log lines, error messages) on all of them.

The rules, stated for operators in ``docs/agent.md`` (*Redaction*), in short:
a key name is split into words (``awsSecretAccessKey`` is ``aws secret access
key``) and is secret when a word is a credential word or two words make a
credential key (``api key``), unless its last word says it is *about* a
secret (``token_endpoint``, ``cookie_names``) or its first a quantity
(``max_tokens``); under a secret name every value is replaced but those of
fields about it (``token_secret: {name, sds_config}`` stays readable); what
cannot be a credential (booleans, certificates, log levels, Envoy's own
``[redacted]``) is kept; text is searched for private keys, auth schemes,
``name: value`` pairs with secret names and passwords in URLs. A JWK (an
object with ``kty``) loses its private and symmetric members
(:data:`JWK_PRIVATE_MEMBERS`), wherever it is: in the answer's JSON, in a
string that holds JSON (a jwt_authn provider's ``local_jwks.inline_string``
is a whole JWKS as text), or in a log line.

Pure: no I/O; table-tested in ``tests/agent/test_redact.py``.
"""

from __future__ import annotations

import functools
import itertools
import json
import re
from typing import Any

from meshplane.jwk import PRIVATE_MEMBERS

REDACTED = "[redacted]"

# A word that makes a name a secret wherever it appears (bar the exceptions below).
_SECRET_WORDS = frozenset(
    {
        "password",
        "passwords",
        "passwd",
        "pwd",
        "passphrase",
        "secret",
        "token",
        "credential",
        "credentials",
        "authorization",
        "cookie",
        "cookies",
        "bearer",
        "apikey",
        "privatekey",
        "accesskey",
        "secretkey",
        "authtoken",
        "sessionid",
    }
)
# ``X key``: a key that is a credential (``api key``), not a lookup key (``hash key``).
_SECRET_KEY_KINDS = frozenset(
    {
        "private",
        "api",
        "access",
        "secret",
        "signing",
        "encryption",
        "decryption",
        "master",
        "ticket",
        "hmac",
        "shared",
        "auth",
        "client",
        "account",
        "storage",
        "license",
        "app",
        "session",
    }
)
# A last word that makes the name about a secret (where, which, how long), not the secret.
_ABOUT_WORDS = frozenset(
    {
        "name",
        "names",
        "file",
        "filename",
        "path",
        "dir",
        "header",
        "headers",
        "type",
        "types",
        "ttl",
        "length",
        "size",
        "bytes",
        "count",
        "limit",
        "expiry",
        "expires",
        "expiration",
        "lifetime",
        "provider",
        "providers",
        "endpoint",
        "uri",
        "url",
        "cluster",
        "config",
        "configs",
        "source",
        "prefix",
        "suffix",
        "id",
        "ids",
        "policy",
        "mode",
        "format",
        "field",
        "fields",
        "version",
        "hash",
        "bucket",
        "fill",
        "interval",
        "timeout",
        "enabled",
        "required",
        "secrets",  # SecretsConfigDump's lists of named secrets (Envoy redacts inside)
        "missing",
        "invalid",
        "expired",
        "location",
        "locations",
        "param",
        "params",
        "domain",
        "attributes",
        "metadata",
    }
)
# A first word that makes the name a number of things (``max_tokens``).
_QUANTITY_WORDS = frozenset({"max", "min", "num", "number", "total", "count"})
# Under a secret name, these fields (and every name about a secret: ``name``,
# ``filename``, ``sds_config``, ``client_id``, ...) locate it and stay readable.
_LOCATOR_FIELDS = frozenset({"environment_variable", "version_info", "last_updated"})
# Values that cannot be credentials: Envoy's log levels (``/logging``: ``secret: info``).
_LEVELS = frozenset({"trace", "debug", "info", "warning", "warn", "error", "critical", "off"})

_WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")
_PEM_PRIVATE = re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----")
_PEM_PRIVATE_BLOCK = re.compile(
    r"-----BEGIN ([A-Z0-9 ]*PRIVATE KEY)-----.*?(?:-----END \1-----|\Z)", re.DOTALL
)
_PEM_CERTIFICATE = re.compile(r"^\s*-----BEGIN (?:TRUSTED )?CERTIFICATE-----")
# An auth scheme then something shaped like a credential (8+ characters, a digit or a
# symbol in it), so that prose such as "Basic authentication" stays readable.
_SCHEME_CREDENTIAL = re.compile(
    r"\b(Bearer|Basic|Digest|Negotiate)(\s+)"
    r"(?=[A-Za-z0-9._~+/=\-]{8})(?=[A-Za-z]*[0-9._~+/=\-])[A-Za-z0-9._~+/=\-]+",
    re.IGNORECASE,
)
_URL_PASSWORD = re.compile(r"(\b[a-z][a-z0-9+.\-]*://[^\s:/@]*:)[^\s/@]+(@)", re.IGNORECASE)
# ``name<sep>``: a possibly quoted name, then ``:``/``=`` or Envoy's ``', '`` (header dumps).
_NAME_SEP = re.compile(
    r"""(?<![A-Za-z0-9_.\-'"])(?P<name>(?P<q>['"]?)[A-Za-z][A-Za-z0-9_.\-]*(?P=q))"""
    r"""(?P<sep>\s*[:=]\s*|(?<=['"])\s*,\s*(?=['"]))"""
)
# The value after it: quoted; or unquoted, an auth scheme included, up to the end of the
# line (or a ``,``/``}``/quote); after ``=`` only up to the next delimiter (a query string).
_VALUE = re.compile(
    r""""(?:[^"\\\n]|\\.)*"|'[^'\n]*'"""
    r"""|(?:(?:bearer|basic|digest|negotiate|token)\s+)?[^\s&;,'"{}\[\]<>][^\r\n,}'"]*""",
    re.IGNORECASE,
)
_PARAMETER_END = re.compile(r"[\s&;,]")
#: The members of a JWK that are key material: the private parts of RSA, EC and
#: OKP keys and the whole of a symmetric (``oct``) key (RFC 7518 section 6;
#: ``oth`` holds further RSA primes). A JWK's names do not say "secret".
JWK_PRIVATE_MEMBERS = PRIVATE_MEMBERS
# ``"d": "..."`` in JSON as text, quotes escaped or not (a JWKS in a log line or in
# an escaped string); the values are base64url.
_JWK_MEMBER_TEXT = re.compile(
    r"""(?P<pre>(?P<bs>\\?)"(?:k|d|p|q|dp|dq|qi)(?P=bs)"\s*:\s*(?P=bs)")"""
    r"""[A-Za-z0-9_\-+/=]+(?P<post>(?P=bs)")"""
)
_SCHEMES = ("bearer", "basic", "digest", "negotiate")
# HeaderValue: ``value`` and, in newer Envoys, ``raw_value`` (bytes).
_HEADER_VALUE_FIELDS = frozenset({"value", "raw_value"})
_CACHED_NAME = 128


def words(name: str) -> list[str]:
    """``awsSecretAccessKey`` / ``aws_secret_access_key`` / ``X-Api-Key`` as lower-case words."""
    return [w.lower() for w in _WORD.findall(name)]


def _is_about(parts: list[str]) -> bool:
    """A name that says where or which a secret is, how long or how many: not the secret."""
    return not parts or parts[-1] in _ABOUT_WORDS or parts[0] in _QUANTITY_WORDS


def is_secret_name(name: str) -> bool:
    """Whether the value of a field, header or parameter called ``name`` is a secret."""
    # Answers repeat the same few hundred names: remember short ones (a bounded cache).
    return _secret_name(name) if len(name) <= _CACHED_NAME else _judge(name)


def _judge(name: str) -> bool:
    parts = words(name)
    if _is_about(parts):
        return False
    if any(w in _SECRET_WORDS for w in parts):
        return True
    pairs = itertools.pairwise(parts)
    return any(second in ("key", "keys") and first in _SECRET_KEY_KINDS for first, second in pairs)


_secret_name = functools.lru_cache(maxsize=4096)(_judge)


def _keeps(value: Any) -> bool:
    """Values that cannot be credentials (kept, never counted)."""
    if value is None or isinstance(value, bool) or value in ("", REDACTED):
        return True
    return isinstance(value, str) and (
        value.lower() in _LEVELS or bool(_PEM_CERTIFICATE.match(value))
    )


def redact_text(text: str) -> tuple[str, int]:
    """``text`` with every credential it shows replaced, and how many were.

    Each rule runs only when a plain substring test says it may apply: most
    strings of an answer (names, stat names, paths) and most log lines need
    none, and a log stream passes every line through here.
    """
    count = 0
    if "kty" in text:
        text, n = _JWK_MEMBER_TEXT.subn(rf"\g<pre>{REDACTED}\g<post>", text)
        count += n
    if "-----BEGIN" in text:
        text, n = _PEM_PRIVATE_BLOCK.subn(REDACTED, text)
        count += n
    if "://" in text:
        text, n = _URL_PASSWORD.subn(rf"\1{REDACTED}\2", text)
        count += n
    if ":" in text or "=" in text or "," in text:
        text, n = _redact_pairs(text)
        count += n
    lowered = text.lower()
    if any(scheme in lowered for scheme in _SCHEMES):
        text, n = _SCHEME_CREDENTIAL.subn(rf"\1\2{REDACTED}", text)
        count += n
    return text, count


def _redact_pairs(text: str) -> tuple[str, int]:
    """``name: value`` (and ``=``, and ``'name', 'value'``) with a secret name.

    A scan, not one ``sub``: a pair that is not secret must not swallow the
    text after it (``url: http://h/?token=T`` still finds ``token=T``).
    """
    out: list[str] = []
    done = count = 0
    at = 0
    while (found := _NAME_SEP.search(text, at)) is not None:
        at = found.end()
        # The name first: matching a value runs to the end of the line, and doing
        # that for every ``a:`` of a hostile line would take quadratic time.
        if not is_secret_name(found.group("name").strip("'\"")):
            continue
        value = _VALUE.match(text, at)
        if value is None:
            continue
        raw = value.group(0)
        quote = raw[0] if len(raw) > 1 and raw[0] in "'\"" and raw[-1] == raw[0] else ""
        if not quote and "=" in found.group("sep"):
            raw = raw[: end.start()] if (end := _PARAMETER_END.search(raw)) else raw
        if REDACTED in raw or not raw.strip("'\" "):
            continue
        out += [text[done:at], f"{quote}{REDACTED}{quote}"]
        done = at = at + len(raw)
        count += 1
    out.append(text[done:])
    return "".join(out), count


def _embedded_json(text: str) -> Any:
    """The object or list a string holds as JSON text (an inline JWKS), else None."""
    if text.lstrip()[:1] not in ("{", "["):
        return None
    try:
        return json.loads(text)
    except ValueError:  # not JSON after all: the text rules still apply
        return None


def _guarded_fields(value: dict[str, Any]) -> frozenset[str] | tuple[str, ...]:
    """The fields of a header (``{key, value}``) or of a header or query parameter
    matcher (``{name, exact_match | string_match | ...}``) that hold the value of a
    secret-named header: ``x-api-key: abc`` matched by a route is a secret too."""
    header = value.get("key")
    if isinstance(header, str) and is_secret_name(header):
        return _HEADER_VALUE_FIELDS
    matches = tuple(key for key in value if key.endswith("_match"))
    name = value.get("name")
    if matches and isinstance(name, str) and is_secret_name(name):
        return matches
    return ()


def redact(document: Any) -> tuple[Any, int]:
    """A copy of the JSON ``document`` with every secret replaced, and how many were."""
    count = 0

    def secret(value: Any) -> Any:
        """Everything under a secret name, but for what locates it."""
        nonlocal count
        if isinstance(value, dict):
            return {
                k: walk(v) if k in _LOCATOR_FIELDS or _is_about(words(k)) else secret(v)
                for k, v in value.items()
            }
        if isinstance(value, list):
            return [secret(item) for item in value]
        if _keeps(value):
            return value
        count += 1
        return REDACTED

    def walk(value: Any) -> Any:
        nonlocal count
        if isinstance(value, dict):
            guarded = _guarded_fields(value)
            if isinstance(value.get("kty"), str):  # a JWK
                guarded = frozenset(guarded) | JWK_PRIVATE_MEMBERS
            return {
                key: secret(item) if key in guarded or is_secret_name(key) else walk(item)
                for key, item in value.items()
            }
        if isinstance(value, list):
            return [walk(item) for item in value]
        if isinstance(value, str):
            if "-----BEGIN" in value and _PEM_PRIVATE.search(value):
                count += 1
                return REDACTED
            if '"kty"' in value:
                inner = _embedded_json(value)
                if inner is not None:
                    before = count
                    clean_inner = walk(inner)
                    if count > before:
                        return json.dumps(clean_inner, separators=(",", ":"))
            clean, n = redact_text(value)
            count += n
            return clean
        return value

    return walk(document), count
