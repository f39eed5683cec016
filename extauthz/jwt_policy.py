"""The decision engine: request attributes + policies + keys + clock → Decision.

Pure logic: no I/O, the clock is an argument, and both adapters (gRPC Check
and HTTP ``http_service``) call the very same ``Engine.decide`` so the two
modes cannot drift apart. The rules, in order (the first failure is the deny
reason):

1. the policy named by the ``meshplane.policy`` context extension (or the
   default) exists; ``allow``/``deny`` are built in;
2. exactly one ``Authorization`` value, ``Bearer`` (any case) + 1*SP + a
   compact JWS of at most 8 KiB;
3. signature valid under an allow-listed algorithm with a key of the matching
   family; ``nbf``/``exp`` finite JSON numbers; issuer/audiences if set;
4. the path claim decodes to a canonical absolute path;
5. ``nbf <= now < exp`` within the leeway (checked on every request, cache or not);
6. the normalized request path starts with that prefix (PREFIX) or also
   ends on a segment boundary (SEGMENT).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from extauthz import claim_metadata
from extauthz.config import ExtAuthzConfig, JwksUriConfig, PolicyConfig
from extauthz.keyring import KeyRing, RemoteKeys
from extauthz.keys import KeySet
from extauthz.paths import PathMemo, decode_path_claim, path_allowed
from extauthz.reasons import Decision, Denied, Reason, deny
from extauthz.token_cache import (
    REFUSED_MAX_CHARS,
    REFUSED_MAX_ENTRIES,
    CachedToken,
    TokenCache,
)
from extauthz.tokens import JwtRules, extract_bearer, verify_token

MAX_CLAIM_HEADER_CHARS = 1024
_UNSAFE_HEADER_VALUE = re.compile(r"[\x00-\x1f\x7f]")

#: Refusals that depend only on the header value, the policy's rules and its
#: keys, so they are kept for the value (see ``token_cache``): never those
#: that depend on the clock or the request path, nor those a JWKS refetch
#: may cure (UNKNOWN_KID, NO_KEYS).
_STATIC_REFUSALS = frozenset(
    {
        Reason.MISSING_AUTHORIZATION,
        Reason.MULTIPLE_AUTHORIZATION,
        Reason.NOT_BEARER,
        Reason.TOKEN_TOO_LARGE,
        Reason.MALFORMED_TOKEN,
        Reason.ALGORITHM_NOT_ALLOWED,
        Reason.UNSUPPORTED_HEADER,
        Reason.KID_REQUIRED,
        Reason.KEY_MISMATCH,
        Reason.BAD_SIGNATURE,
        Reason.BAD_TIME_CLAIM,
        Reason.ISSUER_MISMATCH,
        Reason.AUDIENCE_MISMATCH,
        Reason.BAD_PATH_CLAIM,
    }
)


class CheckAttributes(NamedTuple):
    """What the engine needs from a request, whatever the transport.

    ``authorization`` holds every value seen (raw duplicates included), so the
    engine can deny ambiguity instead of picking one. ``path`` is the raw
    request target as Envoy saw it (query included, not decoded). A named
    tuple, not a frozen dataclass: built on every check, it costs half as much.
    """

    path: str
    authorization: tuple[str, ...]
    policy: str | None = None  # None selects defaultPolicy; any string is looked up


def _header_value(value: Any) -> str | None:
    """A claim rendered as a header value, or None if it cannot be one safely."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        text = str(value)
    elif isinstance(value, float) and math.isfinite(value):
        text = repr(value)
    elif isinstance(value, str):
        text = value
    else:
        return None  # absent, null, objects, lists
    if len(text) > MAX_CLAIM_HEADER_CHARS or _UNSAFE_HEADER_VALUE.search(text):
        return None
    return text


class CompiledPolicy:
    """A policy ready to decide: config, its key ring and its token cache."""

    def __init__(
        self,
        config: PolicyConfig,
        keyring: KeyRing,
        cache_size: int,
        paths: PathMemo | None = None,
    ) -> None:
        self.config = config
        self.name = config.name
        self.keyring = keyring
        self.cache: TokenCache[CachedToken] = TokenCache(cache_size)
        self.refused: TokenCache[Reason] = TokenCache(min(cache_size, REFUSED_MAX_ENTRIES))
        # Denies are values: one per reason, shared (a deny costs no allocation).
        self._denies = {reason: deny(reason, self.name) for reason in Reason}
        self.rules = JwtRules(
            algorithms=config.jwt.algorithms,
            leeway_seconds=config.jwt.leeway_seconds,
            issuer=config.jwt.issuer,
            audiences=config.jwt.audiences,
        )
        # Read on every check: one attribute each, not a chain through the config.
        self._leeway = self.rules.leeway_seconds
        path_claim = config.path_claim
        self._path_match = None if path_claim is None else path_claim.match
        self._paths = PathMemo() if paths is None else paths
        self._known_paths = self._paths.known
        self._base_removes: tuple[str, ...] = (
            ("authorization",) if config.remove_authorization else ()
        )

    def _allow_for(self, claims: Mapping[str, Any]) -> Decision:
        adds: list[tuple[str, str]] = []
        removes = list(self._base_removes)
        for mapping in self.config.claims_to_headers:
            text = _header_value(claims.get(mapping.claim))
            if text is None:
                removes.append(mapping.header)  # never let a client-sent copy through
            else:
                adds.append((mapping.header, text))
        published = claim_metadata.publish(self.config.claims_to_metadata, claims)
        return Decision(True, Reason.OK, self.name, tuple(adds), tuple(removes), published)

    def decide(self, attrs: CheckAttributes, now: float) -> Decision:
        values = attrs.authorization
        keys, generation = self.keyring.current()
        # Keyed by the raw header value: a hit skips even the header
        # parsing, and only a value that passed every rule is ever stored.
        header = values[0] if len(values) == 1 else None
        entry = self.cache.get(header, generation) if header is not None else None
        if entry is None:
            if header is not None:
                refused = self.refused.get(header, generation)
                if refused is not None:
                    return self._denies[refused]
            try:
                entry = self._verify(values, keys)
            except Denied as exc:
                if (
                    header is not None
                    and exc.reason in _STATIC_REFUSALS
                    and len(header) <= REFUSED_MAX_CHARS
                ):
                    self.refused.put(header, exc.reason, generation)
                return self._denies[exc.reason]
            assert header is not None  # extract_bearer accepts exactly one value
            self.cache.put(header, entry, generation)
        leeway = self._leeway
        if now + leeway < entry.nbf:
            return self._denies[Reason.NOT_YET_VALID]
        if now - leeway >= entry.exp:
            if header is not None:
                self.cache.discard(header)
            return self._denies[Reason.EXPIRED]
        match = self._path_match
        if match is not None and entry.prefix is not None:
            raw_path = attrs.path
            path = self._known_paths.get(raw_path)
            if path is None:
                try:
                    path = self._paths.normalize(raw_path)
                except Denied as exc:
                    return self._denies[exc.reason]
            if not path_allowed(path, entry.prefix, match):
                return self._denies[Reason.PATH_NOT_ALLOWED]
        return entry.allow

    def _verify(self, values: tuple[str, ...], keys: KeySet) -> CachedToken:
        """Everything about the token that does not depend on the clock or the
        request: what the token cache keeps. Raises Denied."""
        verified = verify_token(extract_bearer(values), self.rules, keys)
        prefix = None
        if self.config.path_claim is not None:
            prefix = decode_path_claim(verified.claims.get(self.config.path_claim.name))
        return CachedToken(verified.nbf, verified.exp, prefix, self._allow_for(verified.claims))


RemoteFactory = Callable[[JwksUriConfig], RemoteKeys]


class Engine:
    """All policies of one config snapshot. Rebuilt on reload, swapped atomically."""

    def __init__(self, config: ExtAuthzConfig, remote_for: RemoteFactory | None = None) -> None:
        self.config = config
        self.default_policy = config.default_policy
        self.policies: dict[str, CompiledPolicy] = {}
        paths = PathMemo()  # normalization is the same for every policy: one memo
        for name, policy in config.policies.items():
            remotes: list[RemoteKeys] = []
            for uri_config in policy.jwt.jwks_uris:
                if remote_for is None:
                    raise ValueError(f"policy {name!r} needs remote JWKS but no factory given")
                remotes.append(remote_for(uri_config))
            ring = KeyRing(policy.jwt.static_keys, remotes)
            self.policies[name] = CompiledPolicy(policy, ring, config.token_cache_size, paths)
        self._allow = Decision(True, Reason.ALLOW_POLICY, "allow")
        self._deny = deny(Reason.DENY_POLICY, "deny")

    def select(self, attrs: CheckAttributes) -> CompiledPolicy | Decision:
        """The policy for a request, or the final decision for built-ins/unknown."""
        name = self.default_policy if attrs.policy is None else attrs.policy
        policy = self.policies.get(name)
        return self._builtin(name) if policy is None else policy

    def _builtin(self, name: str) -> Decision:
        """The final decision for a name that is no defined policy."""
        if name == "allow":
            return self._allow
        if name == "deny":
            return self._deny
        return deny(Reason.UNKNOWN_POLICY)

    def decide(self, attrs: CheckAttributes, now: float) -> Decision:
        # select()'s rule, inlined: the usual check pays no isinstance.
        name = self.default_policy if attrs.policy is None else attrs.policy
        policy = self.policies.get(name)
        return self._builtin(name) if policy is None else policy.decide(attrs, now)
