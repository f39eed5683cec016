"""The Lua check that runs an ExtAuthzPolicy's path-claim rules inside Envoy.

``jwt_authn`` verifies the token (signature, ``exp``, ``nbf``) and writes its
header and payload to dynamic metadata; this script then applies, on the
same request, exactly what extauthz applies after verification
(``extauthz.paths`` and ``extauthz.jwt_policy``): the ``Authorization``
value's shape, the allowed algorithms and ``kid``s, ``nbf``/``exp`` present
and within the leeway, issuer and audiences, the base64 path claim decoded
with extauthz's refusals, the request path normalised and compared.

Exactness comes from one rule: the script decides only when its verdict is
certainly extauthz's. Whatever it cannot be sure of (a token ``jwt_authn``
refused, an unknown ``kid``, a raw JSON segment with escapes or repeated
members, a byte above 0x7f in the path or the claim) it *refers*: it leaves
the request to the ext_authz filter behind it, which the script skips only
when it has decided (``filter_enabled_metadata`` on
:data:`DECIDED_NAMESPACE`). A referred request is decided by the extauthz
service itself, so its verdict and reason are extauthz's by construction.

The decoder here is written out, strict (either alphabet, not mixed,
canonical trailing bits, padding only when complete), as
``extauthz.paths.decode_path_claim`` is. Envoy 1.40's Lua ``base64Decode()``
is not: it takes the standard alphabet only and accepts non-canonical
trailing bits (docs/gateway.md, "Envoy version").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from meshplane.decision_log import DECISION_ID_HEADER, DENIED_HEADER, DenialKind

#: Dynamic metadata namespace the script writes ``decided: true`` to.
DECIDED_NAMESPACE = "meshplane.local_jwt"
#: The key under :data:`DECIDED_NAMESPACE`.
DECIDED_KEY = "decided"
#: Dynamic metadata namespace of a refusal's ``policy`` and ``rule`` (for the
#: decision line, :mod:`mgmt_api.compiler.denials`).
DENIAL_NAMESPACE = "meshplane.denial"

_LIBRARY = r"""
local JWT_NS = "envoy.filters.http.jwt_authn"
local REFER = 0
local DECIDED_NS, DECIDED_KEY = "meshplane.local_jwt", "decided"

local B64 = {}
do
  local a = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
  for i = 1, 62 do B64[a:byte(i)] = i - 1 end
  B64[43] = 62; B64[47] = 63; B64[45] = 62; B64[95] = 63
end

-- Decode base64 (either alphabet, unpadded) whose characters were checked.
local function b64decode(s)
  local out, n = {}, #s
  local bits, acc = 0, 0
  for i = 1, n do
    acc = acc * 64 + B64[s:byte(i)]
    bits = bits + 6
    if bits >= 8 then
      bits = bits - 8
      local p = 2 ^ bits
      out[#out + 1] = string.char(math.floor(acc / p))
      acc = acc % p
    end
  end
  return table.concat(out), acc
end

-- extauthz.paths.decode_path_claim: the prefix, "bad" or REFER.
local function decode_claim(v)
  if type(v) ~= "string" or #v == 0 or #v > 4096 then return "bad" end
  local body = v
  if v:sub(-2) == "==" then body = v:sub(1, -3)
  elseif v:sub(-1) == "=" then body = v:sub(1, -2) end
  if body ~= v and #v % 4 ~= 0 then return "bad" end
  if not body:find("^[A-Za-z0-9+/_%-]*$") or #body % 4 == 1 then return "bad" end
  if body:find("[+/]") and body:find("[_%-]") then return "bad" end
  local raw, rest = b64decode(body)
  if rest ~= 0 then return "bad" end
  if raw:find("[\128-\255]") then return REFER end
  if raw:sub(1, 1) ~= "/" or raw:find("[%%%z\1-\31\127\\]") then return "bad" end
  for seg in (raw .. "/"):gmatch("([^/]*)/") do
    if seg == "." or seg == ".." then return "bad" end
  end
  return raw
end

local function split(path)
  local segs, start = {}, 2
  while true do
    local s = path:find("/", start, true)
    if not s then segs[#segs + 1] = path:sub(start); return segs end
    segs[#segs + 1] = path:sub(start, s - 1)
    start = s + 1
  end
end

local function remove_dot_segments(path)
  local segs, out = split(path), {}
  local last = #segs
  for i, seg in ipairs(segs) do
    if seg == "." then
      if i == last then out[#out + 1] = "" end
    elseif seg == ".." then
      if #out > 0 then out[#out] = nil end
      if i == last then out[#out + 1] = "" end
    else
      out[#out + 1] = seg
    end
  end
  return "/" .. table.concat(out, "/")
end

local function merge_slashes(path) return (path:gsub("//+", "/")) end

local function unhex(h) return string.char(tonumber(h, 16)) end

-- extauthz.paths.normalize_request_path: the path, a reason or REFER.
local function normalize(raw)
  if raw == nil or raw == "" then return nil, "missing_path" end
  local cut = raw:find("[?#]")
  local path = cut and raw:sub(1, cut - 1) or raw
  if path:sub(1, 1) ~= "/" then return nil, "bad_path" end
  if path:find("[\128-\255]") then return nil, REFER end
  if path:find("[%z\1-\31\127\\]") then return nil, "bad_path" end
  if path:find("%", 1, true) then
    if path:find("%%2[fF]") or path:find("%%5[cC]") then return nil, "bad_path" end
    local i = 1
    while true do
      local s = path:find("%", i, true)
      if not s then break end
      if not path:sub(s + 1, s + 2):find("^%x%x$") then return nil, "bad_path" end
      i = s + 1
    end
    path = path:gsub("%%(%x%x)", unhex)
    if path:find("[\128-\255]") then return nil, REFER end
    if path:find("[%%%z\1-\31\127\\]") then return nil, "bad_path" end
  end
  if not path:find(".", 1, true) and not path:find("//", 1, true) then return path end
  if path:find(";", 1, true) then
    for _, seg in ipairs(split(path)) do
      local head = seg:match("^([^;]*);")
      if head == "." or head == ".." then return nil, "bad_path" end
    end
  end
  local canonical = merge_slashes(remove_dot_segments(path))
  if path:find("//", 1, true) and remove_dot_segments(merge_slashes(path)) ~= canonical then
    return nil, "bad_path"
  end
  return canonical
end

local function allowed(path, prefix, segment)
  local n = #prefix
  if path:sub(1, n) ~= prefix then return false end
  if not segment then return true end
  return #path == n or prefix:sub(-1) == "/" or path:sub(n + 1, n + 1) == "/"
end

-- A JSON text refers unless it is one object of strict JSON (no escapes or
-- control characters in strings, RFC 8259 numbers, true/false/null) whose
-- members (at every depth) have distinct names: what extauthz's strict
-- parser and Envoy's then read alike.
local function plain_json(text)
  if text:find("\\", 1, true) then return false end
  local pos, n = 1, #text
  local function ws() pos = text:find("[^ \t\r\n]", pos) or n + 1 end
  local value
  local function str()
    local e = text:find('"', pos + 1, true)
    if not e then return nil end
    local s = text:sub(pos + 1, e - 1)
    if s:find("[%z\1-\31]") then return nil end
    pos = e + 1
    return s
  end
  local function object()
    pos = pos + 1
    local seen = {}
    ws()
    if text:sub(pos, pos) == "}" then pos = pos + 1; return true end
    while true do
      ws()
      if text:sub(pos, pos) ~= '"' then return false end
      local k = str()
      if k == nil or seen[k] then return false end
      seen[k] = true
      ws()
      if text:sub(pos, pos) ~= ":" then return false end
      pos = pos + 1
      if not value() then return false end
      ws()
      local c = text:sub(pos, pos)
      pos = pos + 1
      if c == "}" then return true end
      if c ~= "," then return false end
    end
  end
  local function array()
    pos = pos + 1
    ws()
    if text:sub(pos, pos) == "]" then pos = pos + 1; return true end
    while true do
      if not value() then return false end
      ws()
      local c = text:sub(pos, pos)
      pos = pos + 1
      if c == "]" then return true end
      if c ~= "," then return false end
    end
  end
  value = function()
    ws()
    local c = text:sub(pos, pos)
    if c == "{" then return object() end
    if c == "[" then return array() end
    if c == '"' then return str() ~= nil end
    for _, word in ipairs({"true", "false", "null"}) do
      if text:sub(pos, pos + #word - 1) == word then pos = pos + #word; return true end
    end
    -- A JSON number: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
    local e = select(2, text:find("^%-?", pos)) + 1
    if text:sub(e, e) == "0" then e = e + 1
    else
      local _, d = text:find("^[1-9]%d*", e)
      if not d then return false end
      e = d + 1
    end
    if text:sub(e, e) == "." then
      local _, d = text:find("^%d+", e + 1)
      if not d then return false end
      e = d + 1
    end
    if text:find("^[eE]", e) then
      local _, d = text:find("^[+-]?%d+", e + 1)
      if not d then return false end
      e = d + 1
    end
    pos = e
    return true
  end
  ws()
  if text:sub(pos, pos) ~= "{" then return false end
  if not object() then return false end
  ws()
  return pos == n + 1
end

local function segment_json(seg)
  if #seg % 4 == 1 then return nil end
  return (b64decode(seg))
end

-- Decision ids only correlate a denial with logs; the seed differs per
-- worker and start (the clock and a table's address), not secret.
math.randomseed(os.time() + tonumber(tostring({}):match("0x(%x+)") or "0", 16) % 1000003)

-- A refusal: extauthz's status, body and headers, the reason header every
-- denial carries, and the policy and rule in dynamic metadata, where the
-- listener's decision-line access log reads them.
local function deny(handle, reason)
  local words = {}
  for i = 1, 8 do words[i] = string.format("%04x", math.random(0, 65535)) end
  local id = table.concat(words)
  local md = handle:streamInfo():dynamicMetadata()
  md:set(P.denial_ns, "policy", P.policy)
  md:set(P.denial_ns, "rule", P.rules[reason] or "")
  handle:respond({[":status"] = "403", ["content-type"] = "application/json",
    [P.reason_header] = reason, [P.denied_header] = P.denied_kind .. " " .. reason,
    [P.id_header] = id},
    '{"error":"forbidden","reason":"' .. reason .. '"}')
end

-- What a token grants, by its Authorization value: {reason} for a refusal
-- or a referral, else {nil, prefix, nbf, exp}. It depends only on the token
-- (which jwt_authn verified) and the policy, so a client's next request skips
-- the decoding. Per worker; emptied when it holds CACHE_ENTRIES values or
-- CACHE_BYTES of keys and prefixes.
local CACHE_ENTRIES, CACHE_BYTES = 1024, 1048576
local cache, cached, cached_bytes = {}, 0, 0

local function judge(auth, md)
  local payload, header = md[P.payload], md[P.header]
  if type(payload) ~= "table" or type(header) ~= "table" then return {REFER} end
  if #auth > 8256 or auth:find(",", 1, true) then return {REFER} end
  local token = auth:match("^[ \t]*[Bb][Ee][Aa][Rr][Ee][Rr] +([%w_%-]+%.[%w_%-]+%.[%w_%-]+)[ \t]*$")
  if token == nil or #token > 8192 then return {REFER} end
  local h64, p64 = token:match("^([^.]+)%.([^.]+)%.")
  local htext, ptext = segment_json(h64), segment_json(p64)
  if htext == nil or ptext == nil or (htext .. ptext):find("[\128-\255]") then return {REFER} end
  if not plain_json(htext) or not plain_json(ptext) then
    return {REFER}
  end
  local alg = header.alg
  if type(alg) ~= "string" or not P.algorithms[alg] then return {REFER} end
  if htext:find('"crit"', 1, true) or htext:find('"b64"', 1, true) then return {REFER} end
  local kid = header.kid
  if kid ~= nil and (type(kid) ~= "string" or not P.kids[kid]) then return {REFER} end
  if kid == nil and htext:find('"kid"', 1, true) then return {REFER} end
  local nbf, exp = payload.nbf, payload.exp
  if type(nbf) ~= "number" or type(exp) ~= "number" then return {"bad_time_claim"} end
  -- Whole seconds only: os.time() is whole, so the comparisons below are
  -- then exactly extauthz's on its fractional clock.
  if nbf ~= math.floor(nbf) or exp ~= math.floor(exp) then return {REFER} end
  if P.issuer ~= nil and payload.iss ~= P.issuer then return {"issuer_mismatch"} end
  if P.audiences ~= nil then
    local aud, ok = payload.aud, false
    if type(aud) == "string" then ok = P.audiences[aud] == true
    elseif type(aud) == "table" then
      for _, v in ipairs(aud) do
        if type(v) == "string" and P.audiences[v] then ok = true end
      end
    end
    if not ok then return {"audience_mismatch"} end
  end
  local prefix = false
  if P.claim ~= nil then
    prefix = decode_claim(payload[P.claim])
    if prefix == REFER then return {REFER} end
    if prefix == "bad" then return {"bad_path_claim"} end
  end
  return {nil, prefix, nbf, exp}
end

local function decide(handle)
  local md = handle:streamInfo():dynamicMetadata():get(JWT_NS)
  if md == nil then return REFER end
  local headers = handle:headers()
  if headers:getNumValues("authorization") ~= 1 then return REFER end
  local auth = headers:get("authorization")
  local grant = cache[auth]
  if grant == nil then
    grant = judge(auth, md)
    if cached >= CACHE_ENTRIES or cached_bytes + #auth + 4096 > CACHE_BYTES then
      cache, cached, cached_bytes = {}, 0, 0
    end
    cache[auth] = grant
    local size = #auth + (type(grant[2]) == "string" and #grant[2] or 0)
    cached, cached_bytes = cached + 1, cached_bytes + size
  end
  if grant[1] ~= nil then return grant[1] end
  local prefix, nbf, exp = grant[2], grant[3], grant[4]
  local now = os.time()
  if now + P.leeway < nbf then return "not_yet_valid" end
  if now - P.leeway >= exp then return "expired" end
  if prefix then
    local path, why = normalize(headers:get(":path"))
    if path == nil then return why end
    if not allowed(path, prefix, P.segment) then return "path_not_allowed" end
  end
  return "ok"
end

function envoy_on_request(handle)
  local verdict = decide(handle)
  if verdict == REFER then return end
  if verdict ~= "ok" then
    deny(handle, verdict)
    return
  end
  if P.remove_authorization then handle:headers():remove("authorization") end
  handle:streamInfo():dynamicMetadata():set(DECIDED_NS, DECIDED_KEY, true)
end
"""


def lua_string(value: str) -> str:
    """A Lua string literal of ``value``'s UTF-8 bytes: every byte that is not
    a letter or a digit written as a decimal escape, so no input can end it."""
    return (
        '"'
        + "".join(
            chr(b) if chr(b).isascii() and chr(b).isalnum() else f"\\{b:03d}"
            for b in value.encode()
        )
        + '"'
    )


def _set(values: Iterable[str]) -> str:
    """A Lua table literal ``{["a"] = true, ...}``."""
    return "{" + ", ".join(f"[{lua_string(v)}] = true" for v in sorted(values)) + "}"


def lua_source(
    *,
    payload_key: str,
    header_key: str,
    algorithms: Iterable[str],
    kids: Iterable[str],
    leeway: int,
    claim: str | None,
    segment: bool,
    issuer: str | None,
    audiences: Iterable[str] | None,
    remove_authorization: bool,
    policy: str,
    rules: Mapping[str, str],
    reason_header: str,
) -> str:
    """The whole script for one policy: its parameters, then the shared check.

    ``policy`` names the policy and ``rules`` maps each reason code to the
    policy's rule it comes from (``extauthz.reasons.RULES``), for the decision
    line; ``reason_header`` is extauthz's own (``extauthz.responses``)."""
    audience_set = None if audiences is None else _set(audiences)
    rule_table = ", ".join(f"[{lua_string(k)}] = {lua_string(v)}" for k, v in sorted(rules.items()))
    params = [
        f"payload = {lua_string(payload_key)}",
        f"header = {lua_string(header_key)}",
        f"algorithms = {_set(algorithms)}",
        f"kids = {_set(kids)}",
        f"leeway = {int(leeway)}",
        f"claim = {'nil' if claim is None else lua_string(claim)}",
        f"segment = {'true' if segment else 'false'}",
        f"issuer = {'nil' if issuer is None else lua_string(issuer)}",
        f"audiences = {'nil' if audience_set is None else audience_set}",
        f"remove_authorization = {'true' if remove_authorization else 'false'}",
        f"policy = {lua_string(policy)}",
        f"rules = {{{rule_table}}}",
        f"denial_ns = {lua_string(DENIAL_NAMESPACE)}",
        f"denied_kind = {lua_string(DenialKind.EXTAUTHZ.value)}",
        f"denied_header = {lua_string(DENIED_HEADER)}",
        f"reason_header = {lua_string(reason_header)}",
        f"id_header = {lua_string(DECISION_ID_HEADER)}",
    ]
    return "local P = {\n  " + ",\n  ".join(params) + "\n}\n" + _LIBRARY
