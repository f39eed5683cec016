"""The shared allow/deny table, run over gRPC Check and the HTTP mode alike.

Each case is a request (policy, raw path, Authorization values) and the
expected reason code (``ok`` = allow). Tokens are minted around the real
clock at import time, valid for an hour either way, so the table is stable
for any realistic test run. ``http=False`` marks requests HTTP/1.1 cannot
carry (raw control characters or backslashes in the request line, an empty
path, Envoy's ``header_map`` raw mode); they run over gRPC only.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from extauthz.reasons import Reason

from .jwtkit import (
    HS_SECRET,
    OTHER_SECRET,
    b64path,
    claims,
    ec_key,
    make_token,
    public_pem,
    rsa_key,
)


@dataclass(frozen=True)
class Case:
    name: str
    path: str
    auth: tuple[str, ...]
    expect: Reason
    policy: str | None = None
    http: bool = True


NOW = time.time()
GOOD = make_token(claims(NOW))
HS384 = make_token(claims(NOW), alg="HS384")
RS = make_token(claims(NOW), alg="RS256", key=rsa_key())
ES = make_token(claims(NOW), alg="ES256", key=ec_key(), header={"kid": "es-1"})
ES_NO_KID = make_token(claims(NOW), alg="ES256", key=ec_key())
ES_OTHER_KEY = make_token(claims(NOW), alg="ES256", key=ec_key(1), header={"kid": "es-1"})
ES_UNKNOWN_KID = make_token(claims(NOW), alg="ES256", key=ec_key(), header={"kid": "nope"})
# HS/RS confusion: HS256 "signed" with the RSA public key PEM as the secret.
CONFUSED = make_token(claims(NOW), alg="HS256", key=public_pem(rsa_key()))


def raw_claims(text: str) -> str:
    """A token whose payload is exactly ``text`` (signed with the right key)."""
    return make_token(None, raw_payload=text)


nbf, exp, p = int(NOW) - 3600, int(NOW) + 3600, b64path("/headers")


def bearer(token: str) -> tuple[str, ...]:
    return (f"Bearer {token}",)


CASES: list[Case] = [
    # --- allows
    Case("valid", "/headers", bearer(GOOD), Reason.OK),
    Case("sub-path", "/headers/x/y", bearer(GOOD), Reason.OK),
    Case("query-cut", "/headers?a=1&b=/../admin", bearer(GOOD), Reason.OK),
    Case("prefix-literal", "/headers-admin", bearer(GOOD), Reason.OK),
    Case("percent-decoded-once", "/%68eaders", bearer(GOOD), Reason.OK),
    Case("double-slash-merged", "//headers", bearer(GOOD), Reason.OK),
    Case("dot-inside-prefix", "/headers/a/../b", bearer(GOOD), Reason.OK),
    Case("scheme-lower", "/headers", (f"bearer {GOOD}",), Reason.OK),
    Case("scheme-upper-spaces", "/headers", (f"BEARER   {GOOD}",), Reason.OK),
    Case(
        "float-times",
        "/headers",
        bearer(make_token(claims(NOW, nbf=nbf + 0.5, exp=exp + 0.5))),
        Reason.OK,
    ),
    Case(
        "unpadded-claim",
        "/headers",
        bearer(make_token(claims(NOW, path=None) | {"path": b64path("/headers", pad=False)})),
        Reason.OK,
    ),
    Case(
        "url-alphabet-claim",
        "/a~b/c",
        bearer(make_token(claims(NOW, path=None) | {"path": b64path("/a~b", urlsafe=True)})),
        Reason.OK,
    ),
    Case(
        "std-alphabet-claim",
        "/a~b/c",
        bearer(make_token(claims(NOW, path=None) | {"path": b64path("/a~b")})),
        Reason.OK,
    ),
    Case("segment-exact", "/headers", bearer(GOOD), Reason.OK, "seg"),
    Case("segment-child", "/headers/x", bearer(GOOD), Reason.OK, "seg"),
    Case("rs256", "/headers", bearer(RS), Reason.OK, "rs"),
    Case("es256-kid", "/headers", bearer(ES), Reason.OK, "es"),
    Case("es256-no-kid", "/headers", bearer(ES_NO_KID), Reason.OK, "es"),
    Case("mixed-rs", "/headers", bearer(RS), Reason.OK, "mixed"),
    Case("mixed-hs", "/headers", bearer(GOOD), Reason.OK, "mixed"),
    Case(
        "issuer-aud",
        "/x",
        bearer(make_token(claims(NOW, path=None, iss="https://idp.example", aud=["zzz", "api"]))),
        Reason.OK,
        "iss",
    ),
    Case("allow-policy", "/x", (), Reason.ALLOW_POLICY, "allow"),
    # --- policy selection
    Case("deny-policy", "/headers", bearer(GOOD), Reason.DENY_POLICY, "deny"),
    Case("unknown-policy", "/headers", bearer(GOOD), Reason.UNKNOWN_POLICY, "nope"),
    # --- path rules
    Case("other-path", "/get", bearer(GOOD), Reason.PATH_NOT_ALLOWED),
    Case("case-sensitive", "/Headers", bearer(GOOD), Reason.PATH_NOT_ALLOWED),
    Case("dotdot-escape", "/headers/../admin", bearer(GOOD), Reason.PATH_NOT_ALLOWED),
    Case("encoded-dotdot", "/headers/%2e%2e/admin", bearer(GOOD), Reason.PATH_NOT_ALLOWED),
    Case("segment-boundary", "/headers-admin", bearer(GOOD), Reason.PATH_NOT_ALLOWED, "seg"),
    Case("encoded-slash", "/headers%2Fx", bearer(GOOD), Reason.BAD_PATH),
    Case("encoded-backslash", "/headers%5cx", bearer(GOOD), Reason.BAD_PATH),
    Case("double-encoding", "/headers/%252e%252e/admin", bearer(GOOD), Reason.BAD_PATH),
    Case("bad-escape", "/headers/%zz", bearer(GOOD), Reason.BAD_PATH),
    Case("encoded-control", "/headers/%0a", bearer(GOOD), Reason.BAD_PATH),
    Case("ambiguous-slashes", "/headers//../admin", bearer(GOOD), Reason.BAD_PATH),
    Case("dotdot-path-param", "/headers/..;/admin", bearer(GOOD), Reason.BAD_PATH),
    Case("raw-backslash", "/headers\\..\\admin", bearer(GOOD), Reason.BAD_PATH, http=False),
    Case("raw-control", "/headers/\x01", bearer(GOOD), Reason.BAD_PATH, http=False),
    Case("empty-path", "", bearer(GOOD), Reason.MISSING_PATH, http=False),
    # --- Authorization header
    Case("no-authorization", "/headers", (), Reason.MISSING_AUTHORIZATION),
    Case("empty-authorization", "/headers", ("",), Reason.MISSING_AUTHORIZATION),
    Case("basic", "/headers", (f"Basic {GOOD}",), Reason.NOT_BEARER),
    Case("no-space", "/headers", (f"Bearer{GOOD}",), Reason.NOT_BEARER),
    Case("scheme-only", "/headers", ("Bearer",), Reason.NOT_BEARER),
    Case(
        "two-values",
        "/headers",
        (f"Bearer {GOOD}", f"Bearer {GOOD}"),
        Reason.MULTIPLE_AUTHORIZATION,
    ),
    Case(
        "merged-values",
        "/headers",
        (f"Bearer {GOOD}, Bearer {GOOD}",),
        Reason.MULTIPLE_AUTHORIZATION,
    ),
    Case(
        "too-large",
        "/headers",
        bearer(make_token(claims(NOW, pad="x" * 9000))),
        Reason.TOKEN_TOO_LARGE,
    ),
    Case("two-segments", "/headers", bearer("abc.def"), Reason.MALFORMED_TOKEN),
    Case("five-segments", "/headers", bearer("a.b.c.d.e"), Reason.MALFORMED_TOKEN),
    Case(
        "empty-signature", "/headers", bearer(GOOD.rsplit(".", 1)[0] + "."), Reason.MALFORMED_TOKEN
    ),
    Case("trailing-garbage", "/headers", (f"Bearer {GOOD} x",), Reason.MALFORMED_TOKEN),
    Case(
        "header-not-json",
        "/headers",
        bearer("bm90LWpzb24." + GOOD.split(".", 1)[1]),
        Reason.MALFORMED_TOKEN,
    ),
    # --- algorithms and signatures
    Case(
        "alg-none",
        "/headers",
        bearer(make_token(claims(NOW), raw_header='{"alg":"none"}')),
        Reason.ALGORITHM_NOT_ALLOWED,
    ),
    Case(
        "alg-missing",
        "/headers",
        bearer(make_token(claims(NOW), raw_header='{"typ":"JWT"}')),
        Reason.ALGORITHM_NOT_ALLOWED,
    ),
    Case("alg-not-listed", "/headers", bearer(HS384), Reason.ALGORITHM_NOT_ALLOWED),
    Case("hs-on-rs-policy", "/headers", bearer(CONFUSED), Reason.ALGORITHM_NOT_ALLOWED, "rs"),
    Case("hs-rs-confusion", "/headers", bearer(CONFUSED), Reason.BAD_SIGNATURE, "mixed"),
    Case("rs-on-hs-policy", "/headers", bearer(RS), Reason.ALGORITHM_NOT_ALLOWED),
    Case(
        "wrong-secret",
        "/headers",
        bearer(make_token(claims(NOW), key=OTHER_SECRET)),
        Reason.BAD_SIGNATURE,
    ),
    Case(
        "tampered-payload",
        "/headers",
        bearer(
            GOOD.split(".")[0]
            + "."
            + make_token(claims(NOW, path="/")).split(".")[1]
            + "."
            + GOOD.split(".")[2]
        ),
        Reason.BAD_SIGNATURE,
    ),
    Case("es-wrong-key", "/headers", bearer(ES_OTHER_KEY), Reason.BAD_SIGNATURE, "es"),
    Case("es-unknown-kid", "/headers", bearer(ES_UNKNOWN_KID), Reason.UNKNOWN_KID, "es"),
    Case(
        "crit-header",
        "/headers",
        bearer(make_token(claims(NOW), header={"crit": ["exp"]})),
        Reason.UNSUPPORTED_HEADER,
    ),
    Case(
        "kid-not-string",
        "/headers",
        bearer(make_token(claims(NOW), header={"kid": 7})),
        Reason.MALFORMED_TOKEN,
    ),
    # --- claims
    Case(
        "exp-string",
        "/headers",
        bearer(make_token(claims(NOW, exp=str(exp)))),
        Reason.BAD_TIME_CLAIM,
    ),
    Case("exp-bool", "/headers", bearer(make_token(claims(NOW, exp=True))), Reason.BAD_TIME_CLAIM),
    Case("exp-list", "/headers", bearer(make_token(claims(NOW, exp=[exp]))), Reason.BAD_TIME_CLAIM),
    Case("exp-null", "/headers", bearer(make_token(claims(NOW, exp=None))), Reason.BAD_TIME_CLAIM),
    Case(
        "exp-missing", "/headers", bearer(make_token(claims(NOW, exp=...))), Reason.BAD_TIME_CLAIM
    ),
    Case(
        "nbf-missing", "/headers", bearer(make_token(claims(NOW, nbf=...))), Reason.BAD_TIME_CLAIM
    ),
    Case(
        "exp-overflow",
        "/headers",
        bearer(raw_claims(f'{{"path":"{p}","nbf":{nbf},"exp":1e400}}')),
        Reason.BAD_TIME_CLAIM,
    ),
    Case(
        "exp-huge-int",
        "/headers",
        bearer(raw_claims(f'{{"path":"{p}","nbf":{nbf},"exp":{"9" * 400}}}')),
        Reason.BAD_TIME_CLAIM,
    ),
    Case(
        "exp-nan",
        "/headers",
        bearer(raw_claims(f'{{"path":"{p}","nbf":{nbf},"exp":NaN}}')),
        Reason.MALFORMED_TOKEN,
    ),
    Case(
        "exp-infinity",
        "/headers",
        bearer(raw_claims(f'{{"path":"{p}","nbf":{nbf},"exp":Infinity}}')),
        Reason.MALFORMED_TOKEN,
    ),
    Case(
        "duplicate-exp",
        "/headers",
        bearer(raw_claims(f'{{"path":"{p}","nbf":{nbf},"exp":1,"exp":{exp}}}')),
        Reason.MALFORMED_TOKEN,
    ),
    Case("payload-array", "/headers", bearer(raw_claims("[1,2]")), Reason.MALFORMED_TOKEN),
    Case("expired", "/headers", bearer(make_token(claims(NOW, exp=int(NOW) - 60))), Reason.EXPIRED),
    Case(
        "not-yet-valid",
        "/headers",
        bearer(make_token(claims(NOW, nbf=int(NOW) + 86400))),
        Reason.NOT_YET_VALID,
    ),
    Case(
        "issuer-wrong",
        "/x",
        bearer(make_token(claims(NOW, path=None, iss="https://evil", aud="api"))),
        Reason.ISSUER_MISMATCH,
        "iss",
    ),
    Case(
        "audience-wrong",
        "/x",
        bearer(make_token(claims(NOW, path=None, iss="https://idp.example", aud="zzz"))),
        Reason.AUDIENCE_MISMATCH,
        "iss",
    ),
    Case(
        "audience-missing",
        "/x",
        bearer(make_token(claims(NOW, path=None, iss="https://idp.example"))),
        Reason.AUDIENCE_MISMATCH,
        "iss",
    ),
    Case(
        "path-claim-missing",
        "/headers",
        bearer(make_token(claims(NOW, path=None))),
        Reason.BAD_PATH_CLAIM,
    ),
    Case(
        "path-claim-number",
        "/headers",
        bearer(make_token(claims(NOW, path=None) | {"path": 1})),
        Reason.BAD_PATH_CLAIM,
    ),
    Case(
        "path-claim-empty",
        "/headers",
        bearer(make_token(claims(NOW, path=None) | {"path": ""})),
        Reason.BAD_PATH_CLAIM,
    ),
    Case(
        "path-claim-relative",
        "/headers",
        bearer(make_token(claims(NOW, path="headers"))),
        Reason.BAD_PATH_CLAIM,
    ),
    Case(
        "path-claim-dotdot",
        "/headers",
        bearer(make_token(claims(NOW, path="/headers/.."))),
        Reason.BAD_PATH_CLAIM,
    ),
    Case(
        "path-claim-percent",
        "/headers",
        bearer(make_token(claims(NOW, path="/head%65rs"))),
        Reason.BAD_PATH_CLAIM,
    ),
    Case(
        "path-claim-not-base64",
        "/headers",
        bearer(make_token(claims(NOW, path=None) | {"path": "/headers"})),
        Reason.BAD_PATH_CLAIM,
    ),
    Case(
        "path-claim-mixed-alphabet",
        "/headers",
        bearer(make_token(claims(NOW, path=None) | {"path": "L2F+Yg_"})),
        Reason.BAD_PATH_CLAIM,
    ),
]

RAW_HEADER_CASES: list[Case] = [
    # Envoy's encode_raw_headers mode: duplicates arrive as separate entries.
    Case("raw-single", "/headers", bearer(GOOD), Reason.OK, http=False),
    Case("raw-duplicate", "/headers", bearer(GOOD) * 2, Reason.MULTIPLE_AUTHORIZATION, http=False),
    Case("raw-not-utf8", "/headers", (), Reason.MALFORMED_TOKEN, http=False),
]

assert len({case.name for case in CASES}) == len(CASES)
assert HS_SECRET  # the hs/seg/iss policies verify with it

# JWT JSON is UTF-8 (RFC 7519); a UTF-16 payload is refused even when signed.
CASES.append(
    Case(
        "payload-utf16",
        "/headers",
        bearer(make_token(json.dumps(claims(NOW)).encode("utf-16"))),
        Reason.MALFORMED_TOKEN,
    )
)
