"""Every denial a proxy decides, and what it tells: the HCM's local-reply
mappers and its decision-line access logs, the same on gateways and sidecars.

Each refusal answers with the reason header
(:data:`~meshplane.decision_log.DENIED_HEADER`, ``<kind> <reason>``), an
``x-decision-id``, and leaves exactly one decision line naming the policy,
the rule and the reason. Who supplies each depends on who decided:

- **a filter inside Envoy** (the mode's RBAC, the local JWT rules' jwt_authn and
  RBAC): Envoy answers with a local reply. A local-reply mapper, chosen by the
  reply's code details (RBAC and jwt_authn name the cause there, e.g.
  ``rbac_access_denied_matched_policy[mode-CUSTOM]`` or
  ``jwt_authn_access_denied{Jwt_is_missing}``), adds the reason header and an
  ``x-decision-id`` of Envoy's ``%UNIQUE_ID%`` (a random UUID), and an access log
  with the same filter writes the line to the proxy's stdout, reading the id
  back from the response;
- **an ExtAuthzPolicy's check inside Envoy** (the path-claim Lua script):
  the script sets the headers itself (its id: 32 random hex digits), and the
  policy and rule in dynamic metadata; the access log writes the line;
- **a service** (the extauthz service's deny, the ratelimit service's 429):
  the service writes the line and sends the id; the proxy writes no line
  (one line per denial). The mapper adds the reason header to the 429 (the
  ratelimit service does not send one); extauthz sends its own.

A line's keys are checked against :mod:`meshplane.decision_log`'s schema at
import, so the proxy's lines and the services' cannot drift apart. Route
metadata (:data:`ROUTE_METADATA_KEY`) names the SecuritySetting (``setting``)
and, on sidecars, the mode (``mode``), which the mappers and lines read.

Pure: constants and protojson builders.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshplane import decision_log as dl
from mgmt_api.compiler import path_claim_lua, quota
from mgmt_api.compiler.protojson import JsonDict

#: A route's metadata namespace: ``setting`` (the SecuritySetting) and ``mode``.
ROUTE_METADATA_KEY = "meshplane"
#: The mode's RBAC policy is named ``mode-<MODE>`` (mesh_authz); the prefix tells its 403.
MODE_POLICY_PREFIX = "mode-"
_CEL = "type.googleapis.com/envoy.extensions.access_loggers.filters.cel.v3.ExpressionFilter"
_STDOUT = "type.googleapis.com/envoy.extensions.access_loggers.stream.v3.StdoutAccessLog"
_SETTING = f"%METADATA(ROUTE:{ROUTE_METADATA_KEY}:setting)%"
_MODE = f"%METADATA(ROUTE:{ROUTE_METADATA_KEY}:mode)%"
_LUA_MD = path_claim_lua.DENIAL_NAMESPACE


@dataclass(frozen=True)
class Denial:
    """One kind of refusal: how it is recognized, and what Envoy adds or writes for it.

    ``details`` is a CEL expression on the local reply (its code details);
    ``policy``, ``rule`` and ``reason`` are Envoy format strings for the line
    and the header. ``header``/``decision_id``: the mapper adds the reason
    header / an id (False: the decider sends it); ``line``: the proxy writes
    the line (False: a service does).
    """

    kind: dl.DenialKind
    details: str
    policy: str
    rule: str
    reason: str
    header: bool
    decision_id: bool
    line: bool


def _details(prefix: str) -> str:
    return f"response.code_details.startsWith('{prefix}')"


#: Every refusal either proxy may answer with, in the order the mappers try them:
#: a sidecar's mode (serviceAccounts for CUSTOM); the local JWT rules' missing or
#: bad token (401) and their "no rule allows" (403); an ExtAuthzPolicy the gateway
#: enforces itself (the Lua check sets the headers); the extauthz service's deny
#: (it sends headers and id, and writes the line); over a rate limit (429: the
#: ratelimit service sends the id and writes the line); over a quota (429 from
#: the gateway's own bucket: the gateway adds both and writes the line).
DENIALS: tuple[Denial, ...] = (
    Denial(
        dl.DenialKind.MODE,
        _details(f"rbac_access_denied_matched_policy[{MODE_POLICY_PREFIX}"),
        policy=_SETTING,
        rule=MODE_POLICY_PREFIX + _MODE,
        reason=_MODE,
        header=True,
        decision_id=True,
        line=True,
    ),
    Denial(
        dl.DenialKind.JWT,
        _details("jwt_authn_access_denied"),
        policy=_SETTING,
        rule="keys",
        reason="%RESPONSE_CODE_DETAILS%",
        header=True,
        decision_id=True,
        line=True,
    ),
    Denial(
        dl.DenialKind.RULES,
        "response.code_details == 'rbac_access_denied_matched_policy[none]'",
        policy=_SETTING,
        rule="rules",
        reason="no_rule_matched",
        header=True,
        decision_id=True,
        line=True,
    ),
    Denial(
        dl.DenialKind.EXTAUTHZ,
        "response.code_details == 'lua_response'",
        policy=f"%DYNAMIC_METADATA({_LUA_MD}:policy)%",
        rule=f"%DYNAMIC_METADATA({_LUA_MD}:rule)%",
        reason="%RESP(X-EXT-AUTHZ-REASON)%",
        header=False,
        decision_id=False,
        line=True,
    ),
    Denial(
        dl.DenialKind.EXTAUTHZ,
        "response.code_details == 'ext_authz_denied'",
        policy="",
        rule="",
        reason="",
        header=False,
        decision_id=False,
        line=False,
    ),
    Denial(
        dl.DenialKind.RATELIMIT,
        "response.code_details == 'request_rate_limited'",
        policy="",
        rule="",
        reason="over_limit",
        header=True,
        decision_id=False,
        line=False,
    ),
    # A quota rule's bucket is empty: the gateway decided alone (no service call),
    # so it writes the line; the policy is the route's quota mark.
    Denial(
        dl.DenialKind.RATELIMIT,
        "response.code_details == 'rate_limited_by_quota'",
        policy=f"%DYNAMIC_METADATA({quota.MARK_NAMESPACE})%",
        rule="quota",
        reason="over_quota",
        header=True,
        decision_id=True,
        line=True,
    ),
)


def _filter(denial: Denial) -> JsonDict:
    return {
        "extensionFilter": {
            "name": "envoy.access_loggers.extension_filters.cel",
            "typedConfig": {"@type": _CEL, "expression": denial.details},
        }
    }


def _header(name: str, value: str) -> JsonDict:
    return {"header": {"key": name, "value": value}, "appendAction": "ADD_IF_ABSENT"}


def _mapper(denial: Denial) -> JsonDict:
    headers = []
    if denial.header:
        headers.append(_header(dl.DENIED_HEADER, dl.denied_value(denial.kind, denial.reason)))
    if denial.decision_id:
        headers.append(_header(dl.DECISION_ID_HEADER, "%UNIQUE_ID%"))
    return {"filter": _filter(denial), "headersToAdd": headers}


def local_reply_config() -> JsonDict:
    """The HCM's ``localReplyConfig``: the reason header and the id on each refusal."""
    return {"mappers": [_mapper(d) for d in DENIALS if d.header or d.decision_id]}


_TIME = "%START_TIME(%Y-%m-%dT%H:%M:%S.%3fZ)%"


def line_format(service: str, denial: Denial) -> JsonDict:
    """The decision line of ``denial`` as Envoy's JSON access-log format."""
    line: JsonDict = {
        "ts": _TIME,
        "level": "info",
        "service": service,
        "logger": dl.LOGGER,
        "msg": dl.MESSAGE,
        "decision_id": f"%RESP({dl.DECISION_ID_HEADER.upper()})%",
        "trace_id": "%TRACE_ID%",
        "time": _TIME,
        "decision": "deny",
        "kind": denial.kind.value,
        "policy": denial.policy,
        "rule": denial.rule,
        "reason": denial.reason,
        "method": "%REQ(:METHOD)%",
        "path": f"%REQ(:PATH):{dl.MAX_FIELD_CHARS}%",
        "peer": "%DOWNSTREAM_PEER_URI_SAN%",
    }
    dl.check_keys(line)
    return line


#: Every refusal is 4xx: a status comparison first keeps a served request from
#: paying for the CEL filters (Envoy's and-filter stops at the first false).
_REFUSED: JsonDict = {
    "statusCodeFilter": {
        "comparison": {
            "op": "GE",
            "value": {"defaultValue": 400, "runtimeKey": "meshplane.denials.min_status"},
        }
    }
}


def access_logs(service: str) -> list[JsonDict]:
    """The HCM's ``accessLog``: one stdout logger per refusal the proxy logs itself,
    each filtered to its refusal, so every refusal gets one line."""
    return [
        {
            "name": "envoy.access_loggers.stdout",
            "filter": {"andFilter": {"filters": [_REFUSED, _filter(d)]}},
            "typedConfig": {
                "@type": _STDOUT,
                "logFormat": {"jsonFormat": line_format(service, d), "omitEmptyValues": False},
            },
        }
        for d in DENIALS
        if d.line
    ]


def denial_settings(service: str) -> JsonDict:
    """What an HTTP connection manager that enforces policy carries for its refusals
    (``service``: ``gateway`` or ``sidecar``, a line's ``service``)."""
    return {"localReplyConfig": local_reply_config(), "accessLog": access_logs(service)}


# Checked once at import: a key the schema does not know fails here, not in a log.
for _denial in DENIALS:
    line_format("check", _denial)
