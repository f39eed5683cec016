"""meshplane.validate, the one config validator: each reader's accepted values and
its located errors (file, line, field path, message), table by table."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from meshplane.config_error import ConfigError
from meshplane.validate import Node, did_you_mean, kind_of, one_of
from meshplane.yamlconf import loads_yaml

Reader = Callable[[Node], Any]


def root(text: str) -> Node:
    return Node(loads_yaml(text, source="t.yaml"), source="t.yaml")


def field(name: str, read: Reader) -> Reader:
    """Read ``name`` of a one-key document with ``read``."""
    return lambda node: read(node.fields(optional=(name,)).required(name))


GOOD: list[tuple[str, Reader, Any]] = [
    ("v: abc\n", field("v", Node.string), "abc"),
    ("v: ' abc '\n", field("v", lambda n: n.string(strip=True)), "abc"),
    ("v: ' abc '\n", field("v", Node.string), " abc "),
    ("v: true\n", field("v", Node.boolean), True),
    ("v: false\n", field("v", Node.boolean), False),
    ("v: 7\n", field("v", lambda n: n.integer(0, 7)), 7),
    ("v: 0.5\n", field("v", lambda n: n.number(0, 1)), 0.5),
    ("v: 1\n", field("v", lambda n: n.number(0, 1)), 1.0),
    ("v: 3\n", field("v", lambda n: n.number(0, above=True)), 3.0),
    ("v: B\n", field("v", lambda n: n.choice(("A", "B"))), "B"),
    ("v: ' https://h/x '\n", field("v", Node.url), "https://h/x"),
    ("v: ldaps://h\n", field("v", lambda n: n.url(("ldap", "ldaps"))), "ldaps://h"),
    ("v: [a, b]\n", field("v", lambda n: [i.string() for i in n.items()]), ["a", "b"]),
    ("v: []\n", field("v", Node.items), []),
    # Optional fields: absent gives the default; null is a value for optional(), not for
    # present(); the typed defaults read through optional().
    ("{}\n", lambda n: n.fields(optional=("v",)).optional("v"), None),
    (
        "v: null\n",
        lambda n: getattr(n.fields(optional=("v",)).optional("v"), "value", "absent"),
        None,
    ),
    ("v: null\n", lambda n: n.fields(optional=("v",)).present("v"), None),
    ("{}\n", lambda n: n.fields(optional=("v",)).boolean("v", default=True), True),
    ("{}\n", lambda n: n.fields(optional=("v",)).integer("v", 5, lo=0, hi=9), 5),
    ("{}\n", lambda n: n.fields(optional=("v",)).number("v", 0.5, lo=0, hi=1), 0.5),
    ("v: 2\n", lambda n: n.fields(optional=("v",)).integer("v", 5, lo=0, hi=9), 2),
    ("v: false\n", lambda n: n.fields(optional=("v",)).boolean("v", default=True), False),
    ("a: 1\nb: 2\n", lambda n: [k for k, _ in n.fields(optional=("a", "b"))], ["a", "b"]),
    ("a: 1\nb: 2\n", lambda n: len(n.fields(optional=("a", "b", "c"))), 2),
    ("a: 1\n", lambda n: "a" in n.fields(optional=("a", "b")), True),
]


@pytest.mark.parametrize(("text", "read", "expected"), GOOD)
def test_readers_accept(text: str, read: Reader, expected: Any) -> None:
    assert read(root(text)) == expected


BAD: list[tuple[str, Reader, int | None, str | None, str]] = [
    # Mappings: unknown keys refused, with the allowed ones and a did-you-mean.
    (
        "a: 1\nclientID: x\n",
        lambda n: n.fields(("a",), ("clientId", "other")),
        2,
        "clientID",
        "unknown key 'clientID' (did you mean 'clientId'?); allowed: a, clientId, other",
    ),
    (
        "rate_limit: {}\nratelimit: 1\n",
        lambda n: n.fields(optional=("rate_limit",)),
        2,
        "ratelimit",
        "unknown key 'ratelimit' (did you mean 'rate_limit'?); allowed: rate_limit",
    ),
    ("zzz: 1\n", lambda n: n.fields(optional=("a",)), 1, "zzz", "unknown key 'zzz'; allowed: a"),
    ("1: x\n", lambda n: n.fields(optional=("a",)), 1, "1", "unknown key 1; allowed: a"),
    ("- a\n", lambda n: n.fields(), 1, None, "must be a mapping, got a list"),
    ("v: x\n", field("v", Node.fields), 1, "v", "must be a mapping, got a string"),
    # Required: absent or null, located where the mapping that lacks it starts.
    ("x:\n  a: 1\n", field("x", lambda n: n.fields(("b",), ("a",))), 2, "x.b", "is required"),
    ("b: null\n", lambda n: n.fields(("b",)), 1, "b", "is required"),
    # Lists and the line of each item.
    ("v: {a: 1}\n", field("v", lambda n: n.items(of="rules")), 1, "v", "a list of rules, got a"),
    (
        "v:\n  - a\n  - ''\n",
        field("v", lambda n: [i.string() for i in n.items()]),
        3,
        "v[1]",
        "must be a non-empty string, got an empty string",
    ),
    # Strings, never from other scalars.
    ("v: 1\n", field("v", Node.string), 1, "v", "must be a non-empty string, got an integer"),
    ("v: '  '\n", field("v", lambda n: n.string(strip=True)), 1, "v", "got a blank string"),
    # Booleans: only true and false.
    ("v: 'true'\n", field("v", Node.boolean), 1, "v", "must be true or false, got a string"),
    ("v: 1\n", field("v", Node.boolean), 1, "v", "must be true or false, got an integer"),
    (
        "v: null\n",
        lambda n: n.fields(optional=("v",)).boolean("v"),
        1,
        "v",
        "must be true or false, got nothing",
    ),
    # Integers: no floats, no booleans, in range.
    ("v: 2.0\n", field("v", lambda n: n.integer(0, 9)), 1, "v", "integer from 0 to 9, got 2.0"),
    ("v: true\n", field("v", lambda n: n.integer(0, 9)), 1, "v", "from 0 to 9, got true"),
    ("v: 10\n", field("v", lambda n: n.integer(0, 9)), 1, "v", "from 0 to 9, got 10"),
    ("v: '5'\n", field("v", lambda n: n.integer(0, 9)), 1, "v", "from 0 to 9, got '5'"),
    # Numbers: no booleans or strings, in range (closed, or open below).
    ("v: true\n", field("v", lambda n: n.number(0, 1)), 1, "v", "number from 0 to 1, got true"),
    ("v: '0.5'\n", field("v", lambda n: n.number(0, 1)), 1, "v", "from 0 to 1, got '0.5'"),
    ("v: 1.5\n", field("v", lambda n: n.number(0, 1)), 1, "v", "from 0 to 1, got 1.5"),
    ("v: 0\n", field("v", lambda n: n.number(0, above=True)), 1, "v", "greater than 0, got 0"),
    ("v: -1\n", field("v", lambda n: n.number(0)), 1, "v", "number of at least 0, got -1"),
    (
        "v: [1]\n",
        field("v", lambda n: n.number(0, 1)),
        1,
        "v",
        "must be a number from 0 to 1, got a list",
    ),
    # Enums.
    ("v: C\n", field("v", lambda n: n.choice(("A", "B"))), 1, "v", "must be A or B, got 'C'"),
    ("v: a\n", field("v", lambda n: n.choice(("A", "B", "C"))), 1, "v", "one of A, B or C"),
    # URLs.
    ("v: ftp://h/x\n", field("v", Node.url), 1, "v", "absolute http/https URL, got 'ftp://h/x'"),
    ("v: https://\n", field("v", Node.url), 1, "v", "absolute http/https URL"),
    # Nested paths and lines, flow and block style.
    (
        "a:\n  b:\n    - {c: 1}\n    - c: 2\n      d: 3\n",
        lambda n: [
            i.fields(("c",))
            for i in n.fields(("a",)).required("a").fields(("b",)).required("b").items()
        ],
        5,
        "a.b[1].d",
        "unknown key 'd'",
    ),
]


@pytest.mark.parametrize(("text", "read", "line", "path", "message"), BAD)
def test_readers_refuse_with_file_line_and_field(
    text: str, read: Reader, line: int | None, path: str | None, message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        read(root(text))
    error = info.value
    assert (error.source, error.line, error.field) == ("t.yaml", line, path), str(error)
    assert message in error.message, str(error)
    prefix = f"t.yaml:{line}: " + (f"{path}: " if path else "")
    assert str(error).startswith(prefix)


def test_documents_built_in_code_take_the_nearest_line() -> None:
    # An environment override puts plain dicts into a located document.
    doc = loads_yaml("a:\n  x: 1\n", source="t.yaml")
    doc["a"]["plain"] = {"b": {"c": [1]}}
    node = Node(doc, source="t.yaml").child("a").child("plain").child("b")
    with pytest.raises(ConfigError) as info:
        node.fields(optional=("d",))
    assert (info.value.line, info.value.field) == (2, "a.plain.b.c")
    item = node.child("c").items()[0]
    assert (item.line, item.path) == (2, "a.plain.b.c[0]")


@pytest.mark.parametrize(
    ("key", "allowed", "hint"),
    [
        ("clientID", ("clientId",), " (did you mean 'clientId'?)"),
        ("algorithm", ("algorithms", "keys"), " (did you mean 'algorithms'?)"),
        ("jwtt", ("jwt", "name"), " (did you mean 'jwt'?)"),
        ("aud", ("audience", "clientId"), ""),
        ("zzz", (), ""),
        (7, ("a",), ""),
    ],
)
def test_did_you_mean(key: object, allowed: tuple[str, ...], hint: str) -> None:
    assert did_you_mean(key, allowed) == hint


@pytest.mark.parametrize(
    ("value", "kind"),
    [
        (None, "nothing"),
        (True, "a boolean"),
        (1, "an integer"),
        (1.5, "a number"),
        ("x", "a string"),
        ({}, "a mapping"),
        ([], "a list"),
        (b"x", "bytes"),
    ],
)
def test_kind_of(value: object, kind: str) -> None:
    assert kind_of(value) == kind


def test_one_of() -> None:
    assert (one_of(["A"]), one_of(["A", "B"]), one_of(["A", "B", "C"])) == (
        "A",
        "A or B",
        "one of A, B or C",
    )
