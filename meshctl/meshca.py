"""The mesh CA in meshctl: ``meshctl rotate meshca`` and the line ``meshctl status`` prints.

``rotate meshca`` calls ``POST .../clusters/{c}/meshca:rotate`` (SET_POLICY
on the cluster; 409, exit 5, while a rotation runs) and prints the ``meshCa``
section the server answers, as ``meshctl status`` shows it for every cluster
(docs/mesh.md, "CA rotation"). The renderers are pure: the section and the
clock are arguments.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from meshctl.client import ApiClient
from meshctl.errors import ApiFailure
from meshctl.kinds import parse_fqn
from meshctl.ops import refine
from meshctl.output import age

#: Hex characters of a CA fingerprint shown on a terminal.
SHORT_FINGERPRINT = 16


def _short(ca: Any) -> str:
    if not isinstance(ca, Mapping):
        return "-"
    fingerprint = str(ca.get("fingerprint", "")).removeprefix("sha256:")
    return f"sha256:{fingerprint[:SHORT_FINGERPRINT]}"


def describe(section: Mapping[str, Any] | None, now: datetime) -> str:
    """One line: the phase, since when, the CAs and how many sidecars hold the newest's."""
    if not section:
        return "mesh CA: -"
    phase = str(section.get("phase", "-"))
    progress = section.get("progress") or {}
    on_new, total = progress.get("onNewCa", 0), progress.get("sidecars", 0)
    if "old" in section:
        cas = f"old {_short(section.get('old'))}, new {_short(section.get('new'))}"
    else:
        signing = section.get("signing") or {}
        cas = f"{_short(signing)}, until {signing.get('notAfter', '-')}"
    since = section.get("phaseSince")
    when = f" for {age(since, now)}" if isinstance(since, str) else ""
    return f"mesh CA {phase}{when}: {cas}; sidecars on the newest CA: {on_new}/{total}"


def rotate(client: ApiClient, name: str) -> dict[str, Any]:
    """Start a rotation of ``ORG/CLUSTER``'s mesh CA; the server's ``meshCa`` section."""
    org, cluster = name.split("/", 1)
    ref = parse_fqn(f"organizations/{org}/clusters/{cluster}")
    try:
        body: dict[str, Any] = client.post(ref.path + "/meshca:rotate")
    except ApiFailure as exc:
        if exc.code_name == "ABORTED":
            raise exc.with_hint(
                f"a rotation runs; watch it with meshctl status --cluster {name}"
            ) from None
        raise refine(exc, ref) from None
    return body
