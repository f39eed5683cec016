"""Policy forms: objects ↔ form fields, and API errors placed beside their field (pure).

Every input is *named by its API field path* relative to the object
(``spec.rateLimit.global.rules[0].limit.unit``), so the console needs no
mapping of its own: :func:`to_body` builds the JSON from the names, and an
API error naming a field (``backendTrafficPolicy.spec.rateLimit.global.rules[0].limit.unit:
Input should be ...``) lands beside the input whose name is the longest
prefix of that field (:func:`place_error`). Validation stays where it is,
in the API: the console only parses what a browser cannot send as JSON
(numbers, lists, JSON text areas), and leaves a bad number as text so the
API's own message names it.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

FieldType = Literal["text", "number", "select", "checkbox", "lines", "csv", "json"]

_PART = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


@dataclass(frozen=True)
class FieldDef:
    name: str  # the API field path, relative to the object
    label: str
    type: FieldType = "text"
    options: tuple[str, ...] = ()
    help: str = ""
    required: bool = False
    group: str = ""  # a heading the template groups fields under


@dataclass
class FormState:
    """What a form template renders: definitions, values (text) and errors by input name."""

    fields: list[FieldDef]
    values: dict[str, str] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    general: list[str] = field(default_factory=list)  # errors that name no input


def split_path(path: str) -> list[str | int]:
    """``a.b[0].c`` → ``["a", "b", 0, "c"]``."""
    return [int(index) if index else key for key, index in _PART.findall(path)]


def get_path(obj: Any, path: str) -> Any:
    for part in split_path(path):
        if isinstance(part, int):
            if not isinstance(obj, list) or part >= len(obj):
                return None
            obj = obj[part]
        else:
            if not isinstance(obj, Mapping):
                return None
            obj = obj.get(part)
    return obj


def set_path(obj: dict[str, Any], path: str, value: Any) -> None:
    parts = split_path(path)
    cursor: Any = obj
    for part, following in itertools.pairwise(parts):
        empty: Any = [] if isinstance(following, int) else {}
        if isinstance(part, int):
            while len(cursor) <= part:
                cursor.append(None)
            if cursor[part] is None:
                cursor[part] = empty
            cursor = cursor[part]
        else:
            cursor = cursor.setdefault(part, empty)
    last = parts[-1]
    if isinstance(last, int):
        while len(cursor) <= last:
            cursor.append(None)
    cursor[last] = value


def to_text(f: FieldDef, value: Any) -> str:
    """A stored value as the text its input shows."""
    if value is None:
        return ""
    if f.type == "checkbox":
        return "on" if value is True else ""
    if f.type == "lines" and isinstance(value, list):
        return "\n".join(str(v) for v in value)
    if f.type == "csv" and isinstance(value, list):
        return ", ".join(str(v) for v in value)
    if f.type == "json":
        return json.dumps(value, indent=2, sort_keys=True)
    return str(value)


def from_object(fields: Sequence[FieldDef], obj: Mapping[str, Any]) -> dict[str, str]:
    return {f.name: to_text(f, get_path(obj, f.name)) for f in fields}


def parse_value(f: FieldDef, text: str) -> tuple[Any, str | None]:
    """(value, local error). ``None`` value: the field is left out of the body."""
    text = text.strip() if f.type != "json" else text
    if f.type == "checkbox":
        return (True if text else None), None
    if not text.strip():
        return None, None
    if f.type == "number":
        try:
            return int(text), None
        except ValueError:
            return text, None  # the API names the field and says what it wants
    if f.type == "lines":
        return [line.strip() for line in text.splitlines() if line.strip()], None
    if f.type == "csv":
        return [item.strip() for item in text.split(",") if item.strip()], None
    if f.type == "json":
        try:
            return json.loads(text), None
        except json.JSONDecodeError as exc:
            return None, f"not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"
    return text, None


def to_body(
    fields: Sequence[FieldDef], form: Mapping[str, str], base: Mapping[str, Any] | None = None
) -> tuple[dict[str, Any], dict[str, str]]:
    """(object, local errors by input name) from submitted form values.

    ``base`` is the object as read: parts the form does not show are kept,
    and the fields it shows replace theirs (an emptied field is removed).
    """
    body: dict[str, Any] = json.loads(json.dumps(base)) if base else {}
    errors: dict[str, str] = {}
    for f in fields:
        value, error = parse_value(f, form.get(f.name, ""))
        if error:
            errors[f.name] = error
            continue
        if value is None:
            _remove(body, f.name)
        else:
            set_path(body, f.name, value)
    return body, errors


def _remove(body: dict[str, Any], path: str) -> None:
    parts = split_path(path)
    parent = get_path(body, _join(parts[:-1])) if len(parts) > 1 else body
    last = parts[-1]
    if isinstance(parent, dict) and isinstance(last, str):
        parent.pop(last, None)
    elif isinstance(parent, list) and isinstance(last, int) and last < len(parent):
        parent[last] = None


def _join(parts: Sequence[str | int]) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else p)
    return out


def prune(value: Any) -> Any:
    """Drop ``None`` list items and mappings left empty by removed fields."""
    if isinstance(value, dict):
        out = {k: prune(v) for k, v in value.items()}
        return {k: v for k, v in out.items() if v is not None and v != {}}
    if isinstance(value, list):
        return [prune(v) for v in value if v is not None]
    return value


def relative_field(field_path: str, body_field: str) -> str:
    """The API names create-body fields ``{bodyField}.spec...``; inputs are relative."""
    prefix = body_field + "."
    return field_path[len(prefix) :] if field_path.startswith(prefix) else field_path


def place_error(field_path: str, names: Sequence[str]) -> str | None:
    """The input that shows an error about ``field_path``: the one whose name is
    its longest prefix (at a path boundary), or None (shown above the form)."""
    best: str | None = None
    for name in names:
        if (
            field_path == name
            or field_path.startswith(name + ".")
            or field_path.startswith(name + "[")
        ) and (best is None or len(name) > len(best)):
            best = name
    return best


def error_message(message: str, field_path: str) -> str:
    """The API's message without the field name it starts with (shown beside it)."""
    prefix = field_path + ": "
    for candidate in (prefix,):
        if message.startswith(candidate):
            return message[len(candidate) :]
    if ": " in message and message.split(": ", 1)[0].endswith(field_path.rsplit(".", 1)[-1]):
        return message.split(": ", 1)[1]
    return message
