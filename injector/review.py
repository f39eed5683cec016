"""AdmissionReview ``admission.k8s.io/v1`` in and out: parsing, checks and the answers.

Pure. Two kinds of bad input, two answers (docs/injector.md, "Bad input"):

- a body that is not an AdmissionReview at all (not JSON, JSON nested
  deeper than :data:`MAX_DEPTH`, another apiVersion/kind, no
  ``request.uid``) is refused with HTTP 400 and a JSON
  ``{code, message, details}`` naming the field (:class:`BadReview`): there
  is no uid to answer, and the API server, with ``failurePolicy: Ignore``,
  admits the pod unchanged. Never a 5xx, so nothing retries in a loop;
- a well-formed review whose pod cannot be patched safely gets
  ``allowed: true``, no patch and a warning (:func:`allow`): the pod runs
  without the sidecar rather than broken, and ``kubectl`` shows why.

Every answer to a review echoes its ``request.uid``.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

API_VERSION = "admission.k8s.io/v1"
KIND = "AdmissionReview"
#: Largest review read. A pod is at most ~1.5 MiB (etcd's object limit) and a
#: CREATE review carries it once (``oldObject`` is null).
MAX_REVIEW_BYTES = 2 * 1024 * 1024
#: Deepest JSON nesting read. A pod nests about 12 levels (affinity terms are the
#: deepest) under the review's 3; anything deeper is no pod.
MAX_DEPTH = 64
#: Kubernetes caps a warning at 120 characters of ASCII, and shows a few of them.
MAX_WARNING_CHARS = 120


class BadReview(ValueError):
    """Not an AdmissionReview this webhook can answer: HTTP 400, naming the field."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field

    def body(self) -> dict[str, Any]:
        details = {"field": self.field} if self.field else {}
        return {"code": "BAD_ADMISSION_REVIEW", "message": self.message, "details": details}


@dataclass(frozen=True)
class Review:
    """The parts of a review's ``request`` the injector reads."""

    uid: str
    group: str
    kind: str
    resource: str
    operation: str
    namespace: str
    object: Any
    dry_run: bool


def _field(doc: Mapping[str, Any], key: str, path: str, *, required: bool = True) -> str:
    value = doc.get(key)
    if value is None and not required:
        return ""
    if not isinstance(value, str) or (required and not value):
        raise BadReview(f"{path} must be a non-empty string", path)
    return value


def parse(body: bytes) -> Review:
    """The review in ``body``; :class:`BadReview` when it is not a v1 AdmissionReview."""
    try:
        doc = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadReview(f"the body is not JSON: {exc}") from None
    except RecursionError:  # the parser's own limit, far below what a 2 MiB body can nest
        raise BadReview(f"the body nests JSON deeper than {MAX_DEPTH} levels") from None
    if too_deep(doc, MAX_DEPTH):
        raise BadReview(f"the body nests JSON deeper than {MAX_DEPTH} levels")
    if not isinstance(doc, dict):
        raise BadReview("the body must be a JSON object (an AdmissionReview)")
    if doc.get("apiVersion") != API_VERSION:
        raise BadReview(f"apiVersion must be {API_VERSION!r}", "apiVersion")
    if doc.get("kind") != KIND:
        raise BadReview(f"kind must be {KIND!r}", "kind")
    request = doc.get("request")
    if not isinstance(request, dict):
        raise BadReview("request must be an object", "request")
    uid = _field(request, "uid", "request.uid")
    kind = request.get("kind")
    resource = request.get("resource")
    if not isinstance(kind, dict) or not isinstance(resource, dict):
        raise BadReview("request.kind and request.resource must be objects", "request.kind")
    return Review(
        uid=uid,
        group=_field(kind, "group", "request.kind.group", required=False),
        kind=_field(kind, "kind", "request.kind.kind"),
        resource=_field(resource, "resource", "request.resource.resource"),
        operation=_field(request, "operation", "request.operation"),
        namespace=_field(request, "namespace", "request.namespace", required=False),
        object=request.get("object"),
        dry_run=request.get("dryRun") is True,
    )


def too_deep(doc: Any, limit: int) -> bool:
    """Whether ``doc`` nests objects and arrays more than ``limit`` levels (no recursion)."""
    stack: list[tuple[Any, int]] = [(doc, 0)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            children: Any = value.values()
        elif isinstance(value, list):
            children = value
        else:
            continue
        if depth >= limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def is_pod_create(review: Review) -> bool:
    return (
        review.group == ""
        and review.kind == "Pod"
        and review.resource == "pods"
        and review.operation == "CREATE"
    )


def _envelope(response: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": KIND, "response": response}


def _warnings(warnings: Sequence[str]) -> list[str]:
    clean = ("".join(c if " " <= c <= "~" else "?" for c in w) for w in warnings)
    return [w[:MAX_WARNING_CHARS] for w in clean]


def allow(uid: str, warnings: Sequence[str] = ()) -> dict[str, Any]:
    """``allowed: true`` and no patch: the pod is admitted as it is."""
    response: dict[str, Any] = {"uid": uid, "allowed": True}
    if warnings:
        response["warnings"] = _warnings(warnings)
    return _envelope(response)


def patched(uid: str, operations: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """``allowed: true`` with a base64 JSONPatch (RFC 6902), as admission v1 wants it."""
    patch = json.dumps(list(operations), separators=(",", ":")).encode()
    return _envelope(
        {
            "uid": uid,
            "allowed": True,
            "patchType": "JSONPatch",
            "patch": base64.b64encode(patch).decode("ascii"),
        }
    )
