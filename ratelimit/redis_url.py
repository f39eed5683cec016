"""Parse the Redis URL into a target description (pure; no connection made).

One URL describes every topology, so the same ``--redis-url`` / ``REDIS_URL``
/ mounted-secret file works everywhere:

- ``redis://[user:password@]host:port[/db]`` standalone; ``rediss://`` with TLS;
- ``redis+sentinel://[user:password@]host:26379,host2:26379/<master>[/db]``
  (``rediss+sentinel://`` with TLS); sentinel credentials, if they differ,
  go in ``?sentinel_username=&sentinel_password=``;
- ``redis+cluster://[user:password@]host:7000,host2:7001`` (``rediss+cluster://``).

TLS options as query parameters: ``ssl_ca_certs``, ``ssl_certfile``,
``ssl_keyfile``, ``ssl_cert_reqs=required|none``, ``ssl_check_hostname=true|false``.
Passwords are percent-decoded and never appear in ``repr`` or logs
(:func:`redact`), nor in parse errors, which never quote the URL.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import parse_qs, unquote

Mode = Literal["standalone", "sentinel", "cluster"]

_SCHEMES: dict[str, tuple[Mode, bool]] = {
    "redis": ("standalone", False),
    "rediss": ("standalone", True),
    "redis+sentinel": ("sentinel", False),
    "rediss+sentinel": ("sentinel", True),
    "redis+cluster": ("cluster", False),
    "rediss+cluster": ("cluster", True),
}
_QUERY_KEYS = frozenset(
    {
        "ssl_ca_certs",
        "ssl_certfile",
        "ssl_keyfile",
        "ssl_cert_reqs",
        "ssl_check_hostname",
        "sentinel_username",
        "sentinel_password",
    }
)


class RedisUrlError(ValueError):
    """The URL is malformed; the message never contains the password.

    Nor any other piece of the URL: a password with an unencoded ``/``, ``?``
    or ``@`` shifts the split, so what the parser takes for a host, a port, a
    path or a parameter name may be a fragment of the password
    (``redis://user:hunter/2@h`` has the "host" ``user:hunter``). Messages
    name the part that is wrong and where, never its text.
    """


_ENCODING_HINT = "; a password containing / ? @ or % must be percent-encoded"


@dataclass(frozen=True)
class RedisTarget:
    """Where Redis is and how to authenticate; secrets are kept out of repr."""

    mode: Mode
    hosts: tuple[tuple[str, int], ...]
    tls: bool = False
    db: int = 0
    master_name: str | None = None
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    sentinel_username: str | None = None
    sentinel_password: str | None = field(default=None, repr=False)
    ssl_ca_certs: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    ssl_cert_reqs: Literal["required", "none"] = "required"
    ssl_check_hostname: bool = True


def _split_host(text: str, default_port: int, number: int) -> tuple[str, int]:
    """``host[:port]`` or ``[v6]:port``; ``number`` (1-based) names it in errors."""
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
    else:
        host, _, port_text = text.rpartition(":") if ":" in text else (text, "", "")
    where = f"host #{number} of the Redis URL"
    if not host:
        raise RedisUrlError(f"missing host name in {where}{_ENCODING_HINT}")
    if port_text and not (port_text.isascii() and port_text.isdigit()):
        raise RedisUrlError(f"invalid port in {where}{_ENCODING_HINT}")
    port = int(port_text) if port_text else default_port
    if not 0 < port < 65536:
        raise RedisUrlError(f"port out of range in {where}")
    return host, port


def parse_redis_url(url: str) -> RedisTarget:
    """Parse ``url``; raises RedisUrlError with a message safe to print."""
    scheme, sep, rest = url.strip().partition("://")
    if not sep or scheme.lower() not in _SCHEMES:
        raise RedisUrlError(
            "the Redis URL must start with one of " + ", ".join(f"{s}://" for s in _SCHEMES)
        )
    mode, tls = _SCHEMES[scheme.lower()]
    rest, _, query = rest.partition("?")
    netloc, _, path = rest.partition("/")
    if "@" in path or "@" in query:
        # Not a master name or a file path: the tail of a password whose "/"
        # or "?" was not encoded, which would otherwise be used (and logged)
        # as one. An "@" that belongs there can be written %40.
        raise RedisUrlError(f"'@' after the host part of the Redis URL{_ENCODING_HINT}")
    userinfo, at, hostpart = netloc.rpartition("@")
    if not at:
        hostpart, userinfo = netloc, ""
    username: str | None = None
    password: str | None = None
    if userinfo:
        user, colon, pw = userinfo.partition(":")
        if colon:
            username, password = unquote(user) or None, unquote(pw)
        else:
            password = unquote(user)  # redis://secret@host: a password alone
    default_port = 26379 if mode == "sentinel" else 6379
    hosts = tuple(
        _split_host(h, default_port, i) for i, h in enumerate(hostpart.split(","), 1) if h
    )
    if not hosts:
        raise RedisUrlError("the Redis URL names no host")
    if mode == "standalone" and len(hosts) > 1:
        raise RedisUrlError("several hosts need redis+sentinel:// or redis+cluster://")
    segments = [s for s in path.split("/") if s]
    master_name = None
    if mode == "sentinel":
        if not segments:
            raise RedisUrlError("a sentinel URL needs the master name as its path")
        master_name = unquote(segments.pop(0))
    db = 0
    if segments:
        if mode == "cluster" or len(segments) > 1 or not segments[0].isdigit():
            shape = {
                "cluster": "a Redis Cluster URL takes no path",
                "sentinel": "the path of a sentinel URL is /<master name>[/<db number>]",
                "standalone": "the path of a Redis URL is /<db number>",
            }[mode]
            raise RedisUrlError(f"invalid path: {shape}{_ENCODING_HINT}")
        db = int(segments[0])
    params = {k: v[-1] for k, v in parse_qs(query, keep_blank_values=True).items()}
    unknown = set(params) - _QUERY_KEYS
    if unknown:
        raise RedisUrlError(
            f"{len(unknown)} unknown parameter(s) in the Redis URL; known: "
            + ", ".join(sorted(_QUERY_KEYS))
            + _ENCODING_HINT
        )
    reqs = params.get("ssl_cert_reqs", "required").lower()
    if reqs not in ("required", "none"):
        raise RedisUrlError("ssl_cert_reqs must be 'required' or 'none'")
    check = params.get("ssl_check_hostname", "true").lower()
    if check not in ("true", "false"):
        raise RedisUrlError("ssl_check_hostname must be 'true' or 'false'")
    return RedisTarget(
        mode=mode,
        hosts=hosts,
        tls=tls,
        db=db,
        master_name=master_name,
        username=username,
        password=password,
        sentinel_username=params.get("sentinel_username") or None,
        sentinel_password=params.get("sentinel_password") or None,
        ssl_ca_certs=params.get("ssl_ca_certs") or None,
        ssl_certfile=params.get("ssl_certfile") or None,
        ssl_keyfile=params.get("ssl_keyfile") or None,
        ssl_cert_reqs="none" if reqs == "none" else "required",
        ssl_check_hostname=check == "true",
    )


def redact(url: str) -> str:
    """The URL for logs: passwords (in userinfo or query) replaced by ``***``.

    Only a URL that parses is shown (parsing refuses an ``@`` outside the
    userinfo, so the split is unambiguous); anything else becomes
    ``<scheme>://***`` (or ``***``), since a password with unencoded
    separators puts its fragments where a host or a path would be.
    """
    scheme, sep, rest = url.strip().partition("://")
    scheme = scheme.lower()
    if not sep or scheme not in _SCHEMES:
        return "***"
    try:
        parse_redis_url(url)
    except RedisUrlError:
        return f"{scheme}://***"
    rest, qmark, query = rest.partition("?")
    netloc, slash, path = rest.partition("/")
    userinfo, at, hostpart = netloc.rpartition("@")
    if at:
        user, colon, _ = userinfo.partition(":")
        netloc = f"{user}:***@{hostpart}" if colon else f"***@{hostpart}"
    if query:
        parts = []
        for item in query.split("&"):
            key, eq, _ = item.partition("=")
            parts.append(f"{key}=***" if "password" in key.lower() and eq else item)
        query = "&".join(parts)
    return f"{scheme}://{netloc}{slash}{path}{qmark}{query}"
