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

Everything left is a metric name. The real evaluation
(``test_dashboards_prometheus``) is the authority on whether a query works;
these names let it also check that each metric and label a query selects
exists in Prometheus, which matters for the panels allowed to stay empty.
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
