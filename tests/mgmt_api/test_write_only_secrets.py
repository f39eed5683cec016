"""Key material is write-only: no key-bearing field of any kind reads back in clear.

The schema of every kind in the registry (:data:`mgmt_api.kinds.KINDS`) is
walked for fields whose names speak of keys, secrets, passwords, tokens or
JWTs, and for free-form objects (a key can land in one whatever its name).
Each needs a row in :data:`FIELDS` or :data:`FREE_FORM`: why it holds no secret, or the
cases that put a secret there through the real REST app (``mgmt-api serve``)
and read everything back: the write's own answer, GET and list as admin and
as ``rbac/reader``, and the cluster's ``envoyconfig`` as JSON and YAML (each
accepted by a real Envoy), and for policy kinds their console pages. No
byte of the secret may appear. A new field
with such a name, or a new free-form object, with no row fails
:func:`test_every_key_bearing_field_has_a_row`.

Keys a kind mints and shows once (a service account's private key, a
cluster's install template) are in the creating answer and in no read after.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm

from mgmt_api.compiler.key_material import EACH, SecretField
from mgmt_api.kinds import KINDS
from tests.mgmt_api.harness import ADMIN_PASSWORD, MgmtServer, err, ok, unique
from tests.mgmt_api.rbac_helpers import grant
from tests.support.envoy import assert_envoy_accepts, get_envoyconfig

# ---- the walk --------------------------------------------------------------

_WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")
#: A field is key-bearing when a word of its path is one of these.
KEY_WORDS = frozenset(
    {
        "key",
        "keys",
        "secret",
        "secrets",
        "password",
        "passphrase",
        "token",
        "tokens",
        "credential",
        "credentials",
        "private",
        "hmac",
        "jwt",
        "jwk",
        "jwks",
        "pem",
        "cert",
        "certificate",
    }
)


def _fields(schema: dict[str, Any], defs: dict[str, Any], path: tuple[str, ...]) -> Iterator[str]:
    """Dotted paths (``*`` for list items) of the leaves and free-form objects."""
    if "$ref" in schema:
        schema = defs[schema["$ref"].rsplit("/", 1)[1]]
    for alternative in (*schema.get("anyOf", ()), *schema.get("allOf", ())):
        yield from _fields(alternative, defs, path)
    if "properties" in schema:
        for name, sub in schema["properties"].items():
            yield from _fields(sub, defs, (*path, name))
    elif schema.get("type") == "array":
        yield from _fields(schema.get("items", {}), defs, (*path, EACH))
    elif path and not schema.get("anyOf") and schema.get("type") != "null":
        yield ".".join(path)


def free_form_fields() -> set[tuple[str, str]]:
    """(kind, dotted path) of every object field of any shape: a key can land in one
    whatever its name, so each needs a row too."""
    out: set[tuple[str, str]] = set()

    def walk(schema: dict[str, Any], defs: dict[str, Any], kind: str, path: str) -> None:
        if "$ref" in schema:
            schema = defs[schema["$ref"].rsplit("/", 1)[1]]
        for alternative in (*schema.get("anyOf", ()), *schema.get("allOf", ())):
            walk(alternative, defs, kind, path)
        for name, sub in (schema.get("properties") or {}).items():
            walk(sub, defs, kind, f"{path}.{name}" if path else name)
        if schema.get("type") == "array":
            walk(schema.get("items", {}), defs, kind, f"{path}.{EACH}")
        if schema.get("type") == "object" and schema.get("additionalProperties") is True:
            out.add((kind, path))

    for kind, kdef in KINDS.items():
        schema = kdef.model.model_json_schema(by_alias=True)
        walk(schema, schema.get("$defs", {}), kind, "")
    return out


def key_bearing_fields() -> set[tuple[str, str]]:
    """(kind, dotted path) of every field of every kind whose name speaks of keys."""
    out: set[tuple[str, str]] = set()
    for kind, kdef in KINDS.items():
        schema = kdef.model.model_json_schema(by_alias=True)
        for path in _fields(schema, schema.get("$defs", {}), ()):
            if {w.lower() for w in _WORD.findall(path)} & KEY_WORDS:
                out.add((kind, path))
    return out


# ---- the cases -------------------------------------------------------------


@dataclass
class Env:
    admin: httpx.Client
    reader: httpx.Client
    org: str
    group: str  # /v2/... of a security group that reaches ``cluster``
    cluster: str  # /v2/... of cluster c1
    consoles: dict[str, httpx.Client]  # console sessions: admin, reader

    def group_ui(self) -> str:
        return f"/ui/o/{self.org}/t/t/w/w/g/g"


@dataclass
class Planted:
    """What a case wrote: where it lives, the secrets, and the write's answer."""

    path: str  # the object ("" when the write was refused)
    collection: str
    secrets: list[str]
    answer: str  # the write's response body
    shown_once: bool = False  # the answer is the one response allowed to carry them
    in_envoyconfig: str | None = None  # a public value proving the object reached it
    console: str | None = None  # the console page of the object
    extra: list[str] = field(default_factory=list)  # more bodies to search


def _kid() -> str:
    return f"kid-{uuid.uuid4().hex[:12]}"


def _rsa_private_jwk() -> dict[str, Any]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwk: dict[str, Any] = json.loads(RSAAlgorithm.to_jwk(key))
    return jwk


PRIVATE_MEMBERS = ("d", "p", "q", "dp", "dq", "qi")


def _private_members(jwk: dict[str, Any]) -> list[str]:
    """The private values of a minted JWK (RSA: d, p, q, ...; EC and OKP: d)."""
    values = [v for m, v in jwk.items() if m in PRIVATE_MEMBERS]
    assert values, jwk
    return values


HMAC_K = "bG9jYWwtand0LWhtYWMta2V5LXNlY3JldC0wMTIzNDU2Nzg5"
RULES = [{"from": [{"jwt": {"iss": "https://idp.test"}}]}]


def _field(body: dict[str, Any]) -> str:
    """The field a 400 names."""
    [violations] = [d["fieldViolations"] for d in body["details"] if "fieldViolations" in d]
    field: str = violations[0]["field"]
    return field


def _setting(env: Env, keys: dict[str, Any]) -> httpx.Response:
    local = {"rules": RULES, "keys": keys}
    body = {"authorization": {"mode": "CLUSTER", "http": {"local": local}}}
    name = unique("s")
    return env.admin.post(f"{env.group}/settings", json={"name": name, "securitySetting": body})


def local_jwks_hmac(env: Env) -> Planted:
    kid = _kid()
    jwks = {"keys": [{"kty": "oct", "alg": "HS256", "kid": kid, "k": HMAC_K}]}
    answer = _setting(env, {"jwks": {"value": json.dumps(jwks)}})
    created = ok(answer)
    return Planted(
        created["fqn"],
        f"{env.group}/settings",
        [HMAC_K],
        answer.text,
        in_envoyconfig=kid,
        console=f"{env.group_ui()}/settings/{created['fqn'].rsplit('/', 1)[1]}",
    )


def local_jwks_rsa_private(env: Env) -> Planted:
    kid = _kid()
    jwk = {**_rsa_private_jwk(), "kid": kid, "alg": "RS256"}
    answer = _setting(env, {"jwks": {"value": json.dumps({"keys": [jwk]})}})
    created = ok(answer)
    secrets = [jwk[m] for m in PRIVATE_MEMBERS]
    return Planted(
        created["fqn"],
        f"{env.group}/settings",
        secrets,
        answer.text,
        in_envoyconfig=kid,
        console=f"{env.group_ui()}/settings/{created['fqn'].rsplit('/', 1)[1]}",
    )


def _private_pem_lines() -> list[str]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    return [line for line in pem.splitlines() if line and not line.startswith("-----")]


def local_pem_private_is_refused(env: Env) -> Planted:
    """Verifying needs the public half: a private PEM is refused, never echoed."""
    lines = _private_pem_lines()
    pem = "-----BEGIN PRIVATE KEY-----\n" + "\n".join(lines) + "\n-----END PRIVATE KEY-----\n"
    answer = _setting(env, {"pem": pem})
    body = err(answer, 400)
    assert _field(body) == "securitySetting.authorization.http.local.keys.pem", body
    return Planted("", f"{env.group}/settings", lines, answer.text)


def _extauthz(env: Env, keys: list[dict[str, Any]], *algorithms: str) -> httpx.Response:
    policy = {"jwt": {"algorithms": list(algorithms), "keys": keys}}
    body = {"name": unique("p"), "extAuthzPolicy": policy}
    return env.admin.post(f"{env.group}/extauthzpolicies", json=body)


def extauthz_hmac_secret(env: Env) -> Planted:
    secret = f"extauthz-hmac-{uuid.uuid4().hex}"
    answer = _extauthz(env, [{"hmacSecret": {"value": secret}}], "HS256")
    fqn = ok(answer)["fqn"]
    console = f"{env.group_ui()}/jwt/{fqn.rsplit('/', 1)[1]}"
    return Planted(fqn, f"{env.group}/extauthzpolicies", [secret], answer.text, console=console)


def extauthz_jwks(env: Env) -> Planted:
    jwk = {**_rsa_private_jwk(), "kid": _kid(), "alg": "RS256"}
    oct_key = {"kty": "oct", "kid": _kid(), "alg": "HS256", "k": HMAC_K}
    value = json.dumps({"keys": [jwk, oct_key]})
    answer = _extauthz(env, [{"jwks": {"value": value}}], "RS256", "HS256")
    secrets = [HMAC_K, *(jwk[m] for m in PRIVATE_MEMBERS)]
    fqn = ok(answer)["fqn"]
    console = f"{env.group_ui()}/jwt/{fqn.rsplit('/', 1)[1]}"
    return Planted(fqn, f"{env.group}/extauthzpolicies", secrets, answer.text, console=console)


def extauthz_private_pem_is_refused(env: Env) -> Planted:
    lines = _private_pem_lines()
    pem = "-----BEGIN PRIVATE KEY-----\n" + "\n".join(lines) + "\n-----END PRIVATE KEY-----\n"
    answer = _extauthz(env, [{"publicKeyPem": {"value": pem}}], "RS256")
    err(answer, 400)
    return Planted("", f"{env.group}/extauthzpolicies", lines, answer.text)


def user_password(env: Env) -> Planted:
    password = f"pw-{uuid.uuid4().hex}"
    name = unique("u")
    body = {"name": name, "user": {"loginName": name, "password": password}}
    answer = env.admin.post(f"/v2/organizations/{env.org}/users", json=body)
    return Planted(ok(answer)["fqn"], f"/v2/organizations/{env.org}/users", [password], answer.text)


def service_account_key(env: Env) -> Planted:
    answer = env.admin.post(
        f"/v2/organizations/{env.org}/serviceaccounts",
        json={"name": unique("sa"), "serviceAccount": {}},
        params={"keyEncoding": "JWK"},
    )
    created = ok(answer)
    secrets = _private_members(json.loads(created["keys"][0]["privateKey"]))
    path = f"/v2/{created['fqn']}"
    # Either encoding of a later read shows the public half only.
    extra = [env.admin.get(path, params={"keyEncoding": e}).text for e in ("JWK", "PEM")]
    return Planted(
        created["fqn"],
        f"/v2/organizations/{env.org}/serviceaccounts",
        secrets,
        answer.text,
        shown_once=True,
        extra=extra,
    )


def cluster_agent_key_and_gateway_token(env: Env) -> Planted:
    answer = env.admin.post(
        f"/v2/organizations/{env.org}/clusters", json={"name": unique("c"), "cluster": {}}
    )
    created = ok(answer)
    helm = created["installTemplate"]["helm"]
    secrets = _private_members(json.loads(helm["secrets"]["clusterServiceAccount"]["jwk"]))
    secrets += re.findall(r"eyJ[\w-]+\.[\w-]+\.[\w-]+", answer.text)  # the gateway's token
    path = f"/v2/{created['fqn']}"
    # A reader cannot mint a key (the install template needs SET_POLICY on the org).
    refused = env.reader.get(path, params={"includeInstallTemplate": "true"})
    err(refused, 403)
    return Planted(
        created["fqn"],
        f"/v2/organizations/{env.org}/clusters",
        secrets,
        answer.text,
        shown_once=True,
        extra=[refused.text],
    )


def cluster_issuer_private_jwk_is_refused(env: Env) -> Planted:
    """A workload token issuer's JWKS verifies tokens: public keys only, the rest refused."""
    jwk = {**_rsa_private_jwk(), "kid": _kid(), "alg": "RS256"}
    identity = {"issuers": [{"issuer": "https://issuer.test", "jwks": {"keys": [jwk]}}]}
    answer = env.admin.post(
        f"/v2/organizations/{env.org}/clusters",
        json={"name": unique("c"), "cluster": {"workloadIdentity": identity}},
    )
    body = err(answer, 400)
    assert _field(body).startswith("cluster.workloadIdentity.issuers[0]"), body
    secrets = [jwk[m] for m in PRIVATE_MEMBERS]
    return Planted("", f"/v2/organizations/{env.org}/clusters", secrets, answer.text)


def profile_with_a_password_is_refused(env: Env) -> Planted:
    """Profiles are free-form and read by everyone below them: no secret goes in."""
    password = f"pw-{uuid.uuid4().hex}"
    url = f"redis://default:{password}@redis.example:6379"
    profile = {"mandates": {"rateLimit": {"backend": {"type": "Redis", "redis": {"url": url}}}}}
    answer = env.admin.post(
        f"/v2/organizations/{env.org}/profiles", json={"name": unique("p"), "profile": profile}
    )
    body = err(answer, 400)
    assert _field(body) == "profile.mandates.rateLimit.backend.redis.url", body
    return Planted("", f"/v2/organizations/{env.org}/profiles", [password], answer.text)


CASES: dict[str, Callable[[Env], Planted]] = {
    f.__name__: f
    for f in (
        local_jwks_hmac,
        local_jwks_rsa_private,
        local_pem_private_is_refused,
        extauthz_hmac_secret,
        extauthz_jwks,
        extauthz_private_pem_is_refused,
        user_password,
        service_account_key,
        cluster_agent_key_and_gateway_token,
        profile_with_a_password_is_refused,
        cluster_issuer_private_jwk_is_refused,
    )
}

#: Every key-bearing field of every kind: the cases that plant a secret in it, or
#: why it holds none.
_PUBLIC_KEY = "public: the key's id, encoding and public half"
FIELDS: dict[tuple[str, str], tuple[str, ...] | str] = {
    ("SecuritySetting", "authorization.http.local.keys.jwks.value"): (
        "local_jwks_hmac",
        "local_jwks_rsa_private",
    ),
    ("SecuritySetting", "authorization.http.local.keys.pem"): ("local_pem_private_is_refused",),
    ("SecuritySetting", "authorization.http.local.keys.jwks.uri"): (
        "where the proxy fetches public keys itself"
    ),
    ("SecuritySetting", "authorization.http.local.rules.*.from.*.jwt.iss"): "a claim to match",
    ("SecuritySetting", "authorization.http.local.rules.*.from.*.jwt.sub"): "a claim to match",
    ("SecuritySetting", "authorization.http.local.rules.*.from.*.jwt.other"): "claims to match",
    # Free-form: its keys (jwt.keys[]) are the ext_authz loader's schema.
    ("ExtAuthzPolicy", "jwt"): (
        "extauthz_hmac_secret",
        "extauthz_jwks",
        "extauthz_private_pem_is_refused",
    ),
    ("User", "password"): ("user_password",),
    ("ServiceAccount", "keys.*.privateKey"): ("service_account_key",),
    ("ServiceAccount", "keys.*.publicKey"): _PUBLIC_KEY,
    ("ServiceAccount", "keys.*.id"): _PUBLIC_KEY,
    ("ServiceAccount", "keys.*.encoding"): _PUBLIC_KEY,
    ("Cluster", "serviceAccount.keys.*.privateKey"): ("cluster_agent_key_and_gateway_token",),
    ("Cluster", "installTemplate.gateway.secrets"): ("cluster_agent_key_and_gateway_token",),
    ("Cluster", "serviceAccount.keys.*.publicKey"): _PUBLIC_KEY,
    ("Cluster", "serviceAccount.keys.*.id"): _PUBLIC_KEY,
    ("Cluster", "serviceAccount.keys.*.encoding"): _PUBLIC_KEY,
    ("Cluster", "installTemplate.gateway.tokenExpireTime"): "a time",
    ("Cluster", "tokenTtl"): "a duration",
    ("Cluster", "workloadIdentity.issuers.*.jwks"): ("cluster_issuer_private_jwk_is_refused",),
    ("Cluster", "rateLimit.backend.redis.tls.certificateRef.name"): "names a Secret, holds none",
    ("Cluster", "rateLimit.backend.redis.tls.certificateRef.namespace"): "names a Secret",
    **{
        (
            "BackendTrafficPolicy",
            f"spec.rateLimit.global.rules.*.clientSelectors.*.jwtClaims.*.{f}",
        ): ("a claim to count by")
        for f in ("name", "type", "value")
    },
}

#: Every object field of any shape: the cases that plant a secret in it, or why
#: none can be there.
FREE_FORM: dict[tuple[str, str], tuple[str, ...] | str] = {
    ("ExtAuthzPolicy", "jwt"): FIELDS[("ExtAuthzPolicy", "jwt")],
    ("ExtAuthzPolicy", "pathClaim"): "checked by the ext_authz loader: {name, match}",
    ("ExtAuthzPolicy", "claimsToHeaders.*"): "checked by the ext_authz loader: {claim, header}",
    ("Profile", "defaults"): ("profile_with_a_password_is_refused",),
    ("Profile", "mandates"): ("profile_with_a_password_is_refused",),
    ("Cluster", "installTemplate.helm"): ("cluster_agent_key_and_gateway_token",),
    ("Cluster", "installTemplate.gateway.secrets"): ("cluster_agent_key_and_gateway_token",),
    ("Cluster", "workloadIdentity.issuers.*.jwks"): ("cluster_issuer_private_jwk_is_refused",),
    ("Cluster", "namespaces.*"): "output only: what the agent reports of a namespace",
    ("Cluster", "state"): "output only: the agent's last report",
}

#: The key fields each kind declares write-only (``Behaviour.secrets``), by the case
#: that plants a secret in each.
DECLARED: dict[tuple[str, str], str] = {
    ("SecuritySetting", "authorization.http.local.keys.jwks.value"): "local_jwks_hmac",
    ("SecuritySetting", "authorization.http.local.keys.pem"): "local_pem_private_is_refused",
    ("ExtAuthzPolicy", "jwt.keys[].hmacSecret.value"): "extauthz_hmac_secret",
    ("ExtAuthzPolicy", "jwt.keys[].jwks.value"): "extauthz_jwks",
    ("ExtAuthzPolicy", "jwt.keys[].publicKeyPem.value"): "extauthz_private_pem_is_refused",
}


def test_every_key_bearing_field_has_a_row() -> None:
    """A field named like a key, with no row, is one nobody checked reads back redacted."""
    found = key_bearing_fields()
    assert sorted(found - set(FIELDS)) == [], "add a row to FIELDS (and a case if secret)"
    assert sorted(set(FIELDS) - found) == [], "a row names a field no kind has"
    free = free_form_fields()
    assert sorted(free - set(FREE_FORM)) == [], "add a row to FREE_FORM (and a case)"
    assert sorted(set(FREE_FORM) - free) == [], "a row names a field no kind has"
    rows = [*FIELDS.values(), *FREE_FORM.values()]
    used = {case for row in rows if isinstance(row, tuple) for case in row}
    assert used == set(CASES)


def test_every_declared_secret_field_is_planted() -> None:
    declared = {
        (kind, f.label())
        for kind, kdef in KINDS.items()
        for f in kdef.behaviour.secrets
        if isinstance(f, SecretField)
    }
    assert declared == set(DECLARED)
    assert set(DECLARED.values()) <= set(CASES)


# ---- reading it all back ---------------------------------------------------


@contextlib.contextmanager
def _console(server: MgmtServer, login: str, password: str) -> Iterator[httpx.Client]:
    """A console session, signed in through the login form as a browser is."""
    with server.client() as browser:
        form = browser.get("/ui/login")
        nonce = re.search(r'name="_csrf" value="([^"]+)"', form.text)
        assert nonce is not None, form.text
        fields = {"_csrf": nonce.group(1), "next": "/ui/", "login": login, "password": password}
        signed = browser.post("/ui/login", data=fields)
        assert signed.status_code == 303, signed.text
        yield browser


@pytest.fixture
def env(
    server: MgmtServer, admin: httpx.Client, org: str, make_user: Callable[..., httpx.Client]
) -> Iterator[Env]:
    base = f"/v2/organizations/{org}"
    ok(admin.post(f"{base}/clusters", json={"name": "c1", "cluster": {}}))
    ok(admin.post(f"{base}/tenants", json={"name": "t", "tenant": {}}))
    workspace = {"namespaceSelector": {"names": ["c1/*"]}}
    ok(admin.post(f"{base}/tenants/t/workspaces", json={"name": "w", "workspace": workspace}))
    group = f"{base}/tenants/t/workspaces/w/securitygroups"
    ok(admin.post(group, json={"name": "g", "securityGroup": {"configMode": "BRIDGED"}}))
    name = unique("r")
    reader = make_user(org, name)
    grant(admin, f"organizations/{org}", "rbac/reader", {"user": f"{base[4:]}/users/{name}"})
    with (
        reader,
        _console(server, "admin", ADMIN_PASSWORD) as admin_ui,
        _console(server, f"{org}/{name}", "user-password-1") as reader_ui,
    ):
        consoles = {"admin": admin_ui, "reader": reader_ui}
        yield Env(admin, reader, org, f"{group}/g", f"{base}/clusters/c1", consoles)


def _reads(env: Env, planted: Planted) -> Iterator[tuple[str, str]]:
    """(what, body) of every read a person could make of the planted object."""
    for who, client in (("admin", env.admin), ("reader", env.reader)):
        if planted.path:
            response = client.get(f"/v2/{planted.path}")
            ok(response)
            yield f"{who} GET", response.text
        yield f"{who} list", client.get(planted.collection, params={"pageSize": "200"}).text
        document = get_envoyconfig(client, env.cluster)
        if planted.in_envoyconfig is not None:
            assert planted.in_envoyconfig in json.dumps(document), "the object reaches c1"
        yield f"{who} envoyconfig", json.dumps(document)
        text = client.get(f"{env.cluster}/envoyconfig", params={"format": "yaml"}).text
        assert_envoy_accepts(yaml.safe_load(text))
        yield f"{who} envoyconfig?format=yaml", text
        console = env.consoles[who]
        for page in (planted.console, env.group_ui()) if planted.console else ():
            response = console.get(page)
            assert response.status_code == 200, (page, response.status_code)
            if page == planted.console and "/jwt/" in page:  # its form shows the keys
                assert "redacted sha256:" in response.text, page
            yield f"{who} console {page}", response.text


@pytest.mark.parametrize("case", sorted(CASES))
def test_no_key_bearing_field_reads_back_in_clear(env: Env, case: str) -> None:
    planted = CASES[case](env)
    assert planted.secrets and all(len(s) >= 16 for s in planted.secrets)
    if planted.shown_once:
        assert all(s in planted.answer for s in planted.secrets), "shown once, at creation"
    else:
        assert [s for s in planted.secrets if s in planted.answer] == [], "the write's answer"
    reads = list(_reads(env, planted))
    reads += [(f"extra {i}", body) for i, body in enumerate(planted.extra)]
    leaks = [(what, s[:12]) for what, body in reads for s in planted.secrets if s in body]
    assert leaks == []


# ---- reproduction: local JWT keys read by a reader, and the round trip ------


def _sha16(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()[:16]


def test_a_reader_gets_no_local_jwt_key_and_a_round_trip_keeps_it(env: Env) -> None:
    """``GET .../settings/{s}`` as rbac/reader returned the HMAC key (JWK ``k``) in clear."""
    planted = local_jwks_hmac(env)
    path = f"/v2/{planted.path}"
    got = ok(env.reader.get(path))
    value = got["authorization"]["http"]["local"]["keys"]["jwks"]["value"]
    assert re.fullmatch(r"<redacted sha256:[0-9a-f]{16}>", value), value
    assert HMAC_K not in json.dumps(got)
    # GET -> edit -> PUT with the marker keeps the key (same fingerprint) ...
    got = ok(env.admin.get(path))
    got["authorization"]["http"]["local"]["clockSkew"] = 5
    updated = ok(env.admin.put(path, json=got))
    assert updated["authorization"]["http"]["local"]["keys"]["jwks"]["value"] == value
    assert updated["authorization"]["http"]["local"]["clockSkew"] == 5
    # ... a marker of a key this setting never had is refused, naming the field ...
    got["etag"] = updated["etag"]
    got["authorization"]["http"]["local"]["keys"]["jwks"]["value"] = (
        f"<redacted sha256:{_sha16('never-stored')}>"
    )
    body = err(env.admin.put(path, json=got), 400)
    assert _field(body) == "securitySetting.authorization.http.local.keys.jwks.value", body
    # ... and so is a marker on create (it would become the key).
    marker_keys = {"jwks": {"value": value}}
    err(_setting(env, marker_keys), 400)
    # The reader cannot write at all.
    err(env.reader.put(path, json=ok(env.admin.get(path))), 403)


@pytest.mark.parametrize(
    ("jwks", "says"),
    [
        ("an-hmac-secret-pasted-as-text-0123456789", "is not JSON"),
        (json.dumps({"keys": [{"kty": "oct", "k": "c2hvcnQta2V5LW9mLTI0LWJ5dGVzLW9r"}]}), "32"),
    ],
)
def test_a_bad_local_jwks_is_refused_without_quoting_it(env: Env, jwks: str, says: str) -> None:
    """A set every proxy would refuse, or a guessable HMAC key, never gets stored."""
    body = err(_setting(env, {"jwks": {"value": jwks}}), 400)
    assert _field(body) == "securitySetting.authorization.http.local.keys.jwks.value", body
    assert says in body["message"]
    secret = jwks if says == "is not JSON" else "c2hvcnQta2V5LW9mLTI0LWJ5dGVzLW9r"
    assert secret not in json.dumps(body)
