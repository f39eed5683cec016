"""Just enough PromQL lexing to list the metric names a query reads.

A full parser would be overkill: the dashboards only need "which series
names does this expression select", and those are exactly the identifiers
left once everything that is *not* a metric name is removed:

- Grafana variables (``$job``, ``${datasource}``, ``[[x]]``, ``$__rate_interval``);
- string literals (label values, ``label_replace`` arguments);
- label matchers ``{...}``, range and subquery selectors ``[...]``;
- grouping clauses ``by (...)``, ``without (...)``, ``on (...)``,
  ``ignoring (...)``, ``group_left (...)``, ``group_right (...)``, whose
  parentheses hold label names, not series;
- ``offset 5m`` / ``@ 123`` modifiers and numbers (``0.99``, ``1e3``, ``5m``);
- function and aggregation names (an identifier followed by ``(``);
- keywords and binary operators (``and``, ``or``, ``unless``, ``bool``).

Everything left is a metric name. An expression that uses a construct this
does not know fails loudly in the tests (the name would not be exported),
rather than silently passing.
"""

from __future__ import annotations

import re

_GRAFANA_VARS = re.compile(r"\$\{[^}]*\}|\$\w+|\[\[[^\]]*\]\]")
_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGES = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(
    r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", re.IGNORECASE
)
_MODIFIERS = re.compile(r"\boffset\s+-?[0-9][0-9a-z]*|@\s*(?:start\(\)|end\(\)|[0-9.]+)")
# An identifier not glued to a preceding digit, dot or word character, so
# the "m" of "5m" or the "e3" of "1e3" is not taken for a name.
_IDENT = re.compile(r"(?<![\w.:])[A-Za-z_:][\w:]*")
_KEYWORDS = frozenset(
    {
        "and",
        "or",
        "unless",
        "bool",
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "offset",
        "inf",
        "nan",
    }
)
_LABEL_VALUES = re.compile(r"^\s*label_values\s*\((?P<args>.*)\)\s*$", re.DOTALL)


def metric_names(expr: str) -> set[str]:
    """The metric names an instant or range PromQL expression selects."""
    text = _GRAFANA_VARS.sub(" ", expr)
    text = _STRINGS.sub('""', text)
    text = _MATCHERS.sub(" ", text)
    text = _RANGES.sub(" ", text)
    text = _GROUPING.sub(" ", text)
    text = _MODIFIERS.sub(" ", text)
    names: set[str] = set()
    for match in _IDENT.finditer(text):
        word = match.group()
        rest = text[match.end() :].lstrip()
        if rest.startswith("("):
            continue  # a function or an aggregation operator
        if word.lower() in _KEYWORDS:
            continue
        names.add(word)
    return names


def template_query_metrics(query: str) -> set[str]:
    """Metric names of a Grafana Prometheus variable query.

    ``label_values(metric{...}, label)`` reads ``metric``; ``label_values(label)``
    reads no metric; ``query_result(expr)`` and plain expressions are PromQL.
    """
    match = _LABEL_VALUES.match(query)
    if match is None:
        inner = re.match(r"^\s*query_result\s*\((?P<expr>.*)\)\s*$", query, re.DOTALL)
        return metric_names(inner.group("expr") if inner else query)
    args = match.group("args")
    # Split on the last top-level comma: the label name never contains one.
    depth = 0
    split_at = -1
    for i, ch in enumerate(args):
        if ch in "({[":
            depth += 1
        elif ch in ")}]":
            depth -= 1
        elif ch == "," and depth == 0:
            split_at = i
    if split_at < 0:
        return set()
    return metric_names(args[:split_at])


_SELECTOR = re.compile(r"(?<![\w.:])([A-Za-z_:][\w:]*)\s*\{([^{}]*)\}")
_MATCHER_LABEL = re.compile(r"([A-Za-z_]\w*)\s*(?:=~|!~|!=|=)")
_GROUPING_LABELS = re.compile(
    r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^()]*)\)", re.IGNORECASE
)


def matcher_labels(expr: str) -> dict[str, set[str]]:
    """Label names used in each metric's ``{...}`` matchers, by metric name."""
    text = _STRINGS.sub('""', _GRAFANA_VARS.sub(" ", expr))
    found: dict[str, set[str]] = {}
    for match in _SELECTOR.finditer(text):
        found.setdefault(match.group(1), set()).update(_MATCHER_LABEL.findall(match.group(2)))
    return found


def grouping_labels(expr: str) -> set[str]:
    """Label names of every ``by``/``without``/``on``/``ignoring``/``group_*`` clause."""
    text = _STRINGS.sub('""', _GRAFANA_VARS.sub(" ", expr))
    names: set[str] = set()
    for match in _GROUPING_LABELS.finditer(text):
        names.update(n.strip() for n in match.group(1).split(",") if n.strip())
    return names


_EQUALITY = re.compile(r'([A-Za-z_]\w*)\s*=\s*"((?:[^"\\]|\\.)*)"')


def matcher_equalities(expr: str) -> set[tuple[str, str, str]]:
    """``(metric, label, value)`` of every exact ``label="value"`` matcher.

    Regex and negative matchers are left out: they do not name one value
    that must exist.
    """
    text = _GRAFANA_VARS.sub(" ", expr)
    found: set[tuple[str, str, str]] = set()
    for match in _SELECTOR.finditer(text):
        for label, value in _EQUALITY.findall(match.group(2)):
            found.add((match.group(1), label, value))
    return found
