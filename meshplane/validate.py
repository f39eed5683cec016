"""The one way a config document is validated: located nodes with typed readers.

Every YAML file meshplane reads (the ext_authz policy file, the rate limit
rules, the management plane's ``spec.identityProvider``, the agent's proxies
file) is walked with :class:`Node`, so they all refuse the same mistakes with
the same words, and every error names the file, the line and the field path
(``c.yaml:7: policies[0].jwt.keys[0].hmacSecret: ...``). The rules:

- a mapping names its required and optional keys (:meth:`Node.fields`); any
  other key is refused, with a did-you-mean when one allowed key is close;
- a required key that is absent or null is an error ("is required");
- values are never coerced: ``"true"`` is not a boolean, ``1`` is not a
  string, ``true`` is not a number and ``2.0`` is not an integer;
- every error is a :class:`~meshplane.config_error.ConfigError`.

Lines come from :mod:`meshplane.yamlconf`'s located containers; a plain
dict or list (a document built in code) still validates, with the line of
the nearest located ancestor.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Collection, Iterator, Sequence
from typing import Any
from urllib.parse import urlsplit

from meshplane.config_error import ConfigError
from meshplane.yamlconf import LocatedDict, LocatedList

_KINDS: tuple[tuple[type, str], ...] = (
    (bool, "a boolean"),  # before int: bool is an int subclass
    (int, "an integer"),
    (float, "a number"),
    (str, "a string"),
    (dict, "a mapping"),
    (list, "a list"),
)


def kind_of(value: Any) -> str:
    """A YAML reader's name for the type of ``value`` ("a mapping", "nothing")."""
    if value is None:
        return "nothing"
    return next((name for cls, name in _KINDS if isinstance(value, cls)), type(value).__name__)


def did_you_mean(key: object, allowed: Collection[str]) -> str:
    """`` (did you mean 'x'?)`` when one allowed key differs only in case or a typo."""
    text = str(key)
    match = {a.lower(): a for a in allowed}.get(text.lower())
    if match is None:
        close = difflib.get_close_matches(text, list(allowed), n=1, cutoff=0.75)
        match = close[0] if close else None
    return f" (did you mean {match!r}?)" if match else ""


def one_of(options: Sequence[str]) -> str:
    """``A or B`` / ``one of A, B or C``, for messages."""
    if len(options) == 1:
        return options[0]
    listed = f"{', '.join(options[:-1])} or {options[-1]}"
    return listed if len(options) == 2 else f"one of {listed}"


class Node:
    """A value in a parsed document and where it is: source, line and field path."""

    __slots__ = ("line", "path", "source", "value")

    def __init__(
        self, value: Any, *, source: str | None = None, path: str = "", line: int | None = None
    ) -> None:
        self.value = value
        self.source = source
        self.path = path
        self.line = line if line is not None else getattr(value, "line", None)

    def error(self, message: str) -> ConfigError:
        """A ConfigError located at this node."""
        return ConfigError(message, source=self.source, line=self.line, field=self.path or None)

    def child(self, key: Any) -> Node:
        """The node under ``key`` of this mapping.

        An absent key gives a node whose value is None, located where the mapping
        starts: the place to add the key.
        """
        value = self.value
        line = value.line_of(key) if isinstance(value, LocatedDict) else None
        return Node(
            value.get(key) if isinstance(value, dict) else None,
            source=self.source,
            path=f"{self.path}.{key}" if self.path else str(key),
            line=line or self.line,
        )

    # ----------------------------------------------------------------- containers

    def fields(self, required: Collection[str] = (), optional: Collection[str] = ()) -> Fields:
        """Check that this is a mapping of only these keys, the required ones set."""
        if not isinstance(self.value, dict):
            raise self.error(f"must be a mapping, got {kind_of(self.value)}")
        allowed = {*required, *optional}
        for key in self.value:
            if key not in allowed:
                raise self.child(key).error(
                    f"unknown key {key!r}{did_you_mean(key, allowed)}; "
                    f"allowed: {', '.join(sorted(allowed))}"
                )
        fields = Fields(self)
        for key in required:
            fields.required(key)
        return fields

    def items(self, *, of: str = "") -> list[Node]:
        """The items of this list (``of`` names them in the error: "a list of descriptors")."""
        value = self.value
        if not isinstance(value, list):
            what = f"a list of {of}" if of else "a list"
            raise self.error(f"must be {what}, got {kind_of(value)}")
        lines = value if isinstance(value, LocatedList) else None
        return [
            Node(
                item,
                source=self.source,
                path=f"{self.path}[{i}]",
                line=(lines.line_of(i) if lines is not None else None) or self.line,
            )
            for i, item in enumerate(value)
        ]

    # ----------------------------------------------------------------- scalars

    def string(self, *, strip: bool = False) -> str:
        """A non-empty string (``strip``: without surrounding blanks, which must leave some)."""
        value = self.value
        if not isinstance(value, str) or not (value.strip() if strip else value):
            got = kind_of(value)
            if isinstance(value, str):
                got = "a blank string" if value else "an empty string"
            raise self.error(f"must be a non-empty string, got {got}")
        return value.strip() if strip else value

    def boolean(self) -> bool:
        """``true`` or ``false``; nothing else (not ``"true"``, not ``1``)."""
        if not isinstance(self.value, bool):
            raise self.error(f"must be true or false, got {kind_of(self.value)}")
        return self.value

    def integer(self, lo: int, hi: int) -> int:
        """An integer in ``[lo, hi]`` (a boolean or a float is refused)."""
        value = self.value
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            raise self.error(f"must be an integer from {lo} to {hi}, got {_shown(value)}")
        return value

    def number(self, lo: float = -math.inf, hi: float = math.inf, *, above: bool = False) -> float:
        """An integer or float in ``[lo, hi]`` (``above``: greater than ``lo``)."""
        value = self.value
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        if not ok or not (lo < value if above else lo <= value) or not value <= hi:
            raise self.error(f"must be a number {_range(lo, hi, above)}, got {_shown(value)}")
        return float(value)

    def choice(self, options: Sequence[str]) -> str:
        """One of ``options`` exactly (an enum)."""
        if not isinstance(self.value, str) or self.value not in options:
            raise self.error(f"must be {one_of(options)}, got {_shown(self.value)}")
        return self.value

    def url(self, schemes: Sequence[str] = ("http", "https")) -> str:
        """An absolute URL with one of ``schemes`` and a host."""
        text = self.string(strip=True)
        parts = urlsplit(text)
        if parts.scheme not in schemes or not parts.netloc:
            raise self.error(f"must be an absolute {'/'.join(schemes)} URL, got {text!r}")
        return text


class Fields:
    """The keys of one mapping that :meth:`Node.fields` checked, read as nodes."""

    __slots__ = ("node",)

    def __init__(self, node: Node) -> None:
        self.node = node

    def __contains__(self, key: str) -> bool:
        return key in self.node.value

    def __iter__(self) -> Iterator[tuple[str, Node]]:
        return ((key, self.node.child(key)) for key in self.node.value)

    def __len__(self) -> int:
        return len(self.node.value)

    def required(self, key: str) -> Node:
        """The node under ``key``; absent or null is an error."""
        child = self.node.child(key)
        if child.value is None:
            raise child.error("is required")
        return child

    def optional(self, key: str) -> Node | None:
        """The node under ``key``, or None when the key is absent (null is a value)."""
        return self.node.child(key) if key in self.node.value else None

    def boolean(self, key: str, default: bool = False) -> bool:
        """An optional boolean (see :meth:`Node.boolean`); ``default`` when absent."""
        child = self.optional(key)
        return default if child is None else child.boolean()

    def integer(self, key: str, default: int, *, lo: int, hi: int) -> int:
        """An optional integer in ``[lo, hi]``; ``default`` when absent."""
        child = self.optional(key)
        return default if child is None else child.integer(lo, hi)

    def number(self, key: str, default: float, *, lo: float, hi: float = math.inf) -> float:
        """An optional number in ``[lo, hi]``; ``default`` when absent."""
        child = self.optional(key)
        return default if child is None else child.number(lo, hi)

    def present(self, key: str) -> Node | None:
        """The node under ``key``, or None when the key is absent or null."""
        child = self.optional(key)
        return child if child is not None and child.value is not None else None


def _range(lo: float, hi: float, above: bool) -> str:
    if math.isinf(hi):
        return f"greater than {lo:g}" if above else f"of at least {lo:g}"
    return f"from {lo:g} to {hi:g}"


def _shown(value: Any) -> str:
    """The offending value for a message: short scalars as written, the rest by kind."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float) or (isinstance(value, str) and len(value) <= 40):
        return repr(value)
    return kind_of(value)
