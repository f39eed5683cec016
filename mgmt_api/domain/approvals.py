"""The approval-policy state machine of spec section 3, with no I/O.

A policy is attached to one resource (an organization or a cluster). It holds
a ``mode`` and two lists of :class:`Access` entries, ``requested`` and
``approved``, with at most one entry per subject in each list. Every
transition is a function from the old policy to a new one (policies are
immutable), or raises :class:`ApprovalError` without changing anything; the
service layer stores the result and audits it.

The access check answers from the mode and the lists alone:

* ``UNRESTRICTED``: every subject is allowed;
* ``ALLOW_REQUESTED``: subjects with the permission in ``requested`` or
  ``approved`` are allowed (a request is granted the moment it is made);
* ``REQUIRE_APPROVAL``: only ``approved`` counts; requests are pending.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, NotRequired, TypedDict


class Mode(enum.StrEnum):
    UNRESTRICTED = "UNRESTRICTED"
    ALLOW_REQUESTED = "ALLOW_REQUESTED"
    REQUIRE_APPROVAL = "REQUIRE_APPROVAL"


class ApprovalError(Exception):
    """A refused transition; ``reason`` is ``NOT_FOUND`` (the only kind there is)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def _not_found(message: str) -> ApprovalError:
    return ApprovalError("NOT_FOUND", message)


def _unique(permissions: Iterable[str]) -> tuple[str, ...]:
    """Permissions without repeats, in first-seen order (stable output, stable etags)."""
    return tuple(dict.fromkeys(permissions))


class AccessJson(TypedDict):
    subject: str
    permissions: list[str]


class PolicyJson(TypedDict):
    """An approval policy as stored (its resource's spec)."""

    mode: str
    requested: list[AccessJson]
    approved: list[AccessJson]
    metadata: NotRequired[dict[str, Any]]  # the client's, as it sent it


@dataclass(frozen=True, slots=True)
class Access:
    subject: str
    permissions: tuple[str, ...]

    def to_json(self) -> AccessJson:
        return {"subject": self.subject, "permissions": list(self.permissions)}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Access:
        return cls(str(raw["subject"]), _unique(raw.get("permissions") or ()))


def access(subject: str, permissions: Iterable[str]) -> Access:
    return Access(subject, _unique(permissions))


@dataclass(frozen=True, slots=True)
class Policy:
    mode: Mode
    requested: tuple[Access, ...] = ()
    approved: tuple[Access, ...] = ()
    metadata: Mapping[str, Any] | None = field(default=None)

    def to_json(self) -> PolicyJson:
        out: PolicyJson = {
            "mode": self.mode.value,
            "requested": [a.to_json() for a in self.requested],
            "approved": [a.to_json() for a in self.approved],
        }
        if self.metadata is not None:
            out["metadata"] = dict(self.metadata)
        return out

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Policy:
        return cls(
            Mode(raw["mode"]),
            tuple(Access.from_json(a) for a in raw.get("requested") or ()),
            tuple(Access.from_json(a) for a in raw.get("approved") or ()),
            raw.get("metadata"),
        )


def _find(entries: tuple[Access, ...], subject: str) -> Access | None:
    return next((a for a in entries if a.subject == subject), None)


def _without(entries: tuple[Access, ...], subject: str) -> tuple[Access, ...]:
    return tuple(a for a in entries if a.subject != subject)


def _merged(entries: tuple[Access, ...], new: Access) -> tuple[Access, ...]:
    """``entries`` with ``new``'s permissions added to its subject's entry (or appended)."""
    old = _find(entries, new.subject)
    if old is None:
        return (*entries, new)
    joined = Access(new.subject, _unique((*old.permissions, *new.permissions)))
    return tuple(joined if a.subject == new.subject else a for a in entries)


# ---- transitions -------------------------------------------------------------


def set_policy(
    current: Policy | None, mode: Mode, *, metadata: Mapping[str, Any] | None = None
) -> Policy:
    """SetPolicy: enable checks with ``mode`` and ``metadata``; the lists are kept.

    Changing the mode of a live policy must not silently revoke approvals,
    and the lists change only through the transitions below, each with its
    own permission and audit record (a new policy starts empty).
    """
    if current is None:
        return Policy(mode, metadata=metadata)
    return replace(current, mode=mode, metadata=metadata)


def add_request(policy: Policy, request: Access) -> Policy:
    """``requested:add``: record the request; a subject's repeated requests merge."""
    return replace(policy, requested=_merged(policy.requested, request))


def approve_request(policy: Policy, approval: Access) -> Policy:
    """``requested:approve``: move the subject's request to ``approved``.

    The permissions of the approval are what is granted: when they differ from
    the request's, the requested ones are discarded.
    """
    if _find(policy.requested, approval.subject) is None:
        raise _not_found(f"no pending access request of {approval.subject}")
    return replace(
        policy,
        requested=_without(policy.requested, approval.subject),
        approved=_merged(policy.approved, approval),
    )


def delete_request(policy: Policy, subject: str) -> Policy:
    """``requested:delete``: withdraw a pending request.

    An approved request no longer exists as a request: NOT_FOUND, and nothing
    changes (``approved:delete`` revokes it).
    """
    if _find(policy.requested, subject) is None:
        hint = " (it was approved; use approved:delete)" if _find(policy.approved, subject) else ""
        raise _not_found(f"no pending access request of {subject}{hint}")
    return replace(policy, requested=_without(policy.requested, subject))


def add_approved(policy: Policy, grant: Access) -> Policy:
    """``approved:add``: grant access directly, without a request."""
    return replace(policy, approved=_merged(policy.approved, grant))


def delete_approved(policy: Policy, subject: str) -> Policy:
    """``approved:delete``: revoke an approved access."""
    if _find(policy.approved, subject) is None:
        raise _not_found(f"no approved access of {subject}")
    return replace(policy, approved=_without(policy.approved, subject))


# ---- the access check ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Decision:
    allowed: bool
    reason: str


def check(policy: Policy, subject: str, permission: str) -> Decision:
    """Is ``subject`` allowed ``permission`` on the policy's resource?"""
    if policy.mode is Mode.UNRESTRICTED:
        return Decision(True, "mode UNRESTRICTED allows every subject")
    approved = _find(policy.approved, subject)
    if approved is not None and permission in approved.permissions:
        return Decision(True, f"{permission} is approved")
    requested = _find(policy.requested, subject)
    has_request = requested is not None and permission in requested.permissions
    if policy.mode is Mode.ALLOW_REQUESTED and has_request:
        return Decision(True, f"{permission} is requested and mode ALLOW_REQUESTED allows it")
    if has_request:
        return Decision(False, f"{permission} is requested, pending approval")
    return Decision(False, f"{permission} is neither requested nor approved")
