"""Key loading and the algorithm-family binding (pure)."""

from __future__ import annotations

import json
import time

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ed25519, rsa
from jwt.algorithms import OKPAlgorithm, RSAAlgorithm

from extauthz.keys import KeyError_, KeySet, hmac_key, jwk_key, parse_jwks, pem_public_key
from extauthz.reasons import Denied, Reason
from extauthz.tokens import JwtRules, verify_token

from .jwtkit import HS_SECRET, b64u, claims, ec_key, public_jwk, public_pem, rsa_key


def test_each_key_serves_only_its_family_and_curve() -> None:
    hs = hmac_key(HS_SECRET)
    rs = pem_public_key(public_pem(rsa_key()))
    es = pem_public_key(public_pem(ec_key()))
    es384 = pem_public_key(public_pem(ec_key(0, "P-384")))
    assert hs.usable_for("HS256") and not hs.usable_for("RS256")
    assert rs.usable_for("RS256") and rs.usable_for("PS256") and not rs.usable_for("HS256")
    assert es.usable_for("ES256") and not es.usable_for("ES384")
    assert es384.usable_for("ES384") and not es384.usable_for("ES256")
    assert not any(key.usable_for("none") for key in (hs, rs, es))


@pytest.mark.parametrize(
    ("jwk", "message"),
    [
        ({"kty": "oct", "k": b64u(HS_SECRET), "alg": "RS256"}, "non-HMAC alg"),
        ({"kty": "EC", "crv": "P-999", "x": "AA", "y": "AA"}, "curve"),
        ({"kty": "RSA", "n": "AQAB", "e": "AQAB", "use": "enc"}, "use"),
        ({"kty": "RSA", "n": "AQAB", "e": "AQAB", "alg": "none"}, "alg"),
        ({"kty": "weird"}, "kty"),
        ({"kty": "oct"}, "without k"),
        ({"kty": "oct", "k": b64u(HS_SECRET), "key_ops": ["encrypt"]}, "key_ops"),
    ],
)
def test_unusable_jwks_are_refused(jwk: dict[str, object], message: str) -> None:
    with pytest.raises(KeyError_) as info:
        jwk_key(jwk)
    assert message in str(info.value)


def test_weak_rsa_jwk_is_skipped_but_good_keys_load() -> None:
    weak = rsa.generate_private_key(public_exponent=65537, key_size=1024)
    weak_jwk = {**json.loads(RSAAlgorithm.to_jwk(weak.public_key())), "kid": "weak"}
    parsed = parse_jwks({"keys": [weak_jwk, public_jwk(rsa_key(), "good")]})
    assert [k.kid for k in parsed.keys.keys] == ["good"]
    assert "2048" in parsed.skipped[0]


def test_eddsa_and_ps256_verify() -> None:
    now = time.time()
    ed = ed25519.Ed25519PrivateKey.generate()
    ed_jwk = {**json.loads(OKPAlgorithm.to_jwk(ed.public_key())), "kid": "ed"}
    keys = KeySet.of([jwk_key(ed_jwk), jwk_key(public_jwk(rsa_key(), "rs"))])
    rules = JwtRules(frozenset({"EdDSA", "PS256"}))
    ed_token = jwt.encode(claims(now), ed, algorithm="EdDSA", headers={"kid": "ed"})
    ps_token = jwt.encode(claims(now), rsa_key(), algorithm="PS256", headers={"kid": "rs"})
    assert verify_token(ed_token, rules, keys).exp == claims(now)["exp"]
    assert verify_token(ps_token, rules, keys).nbf == claims(now)["nbf"]
    # The same RSA key with an algorithm outside the allow-list is refused.
    rs_token = jwt.encode(claims(now), rsa_key(), algorithm="RS256", headers={"kid": "rs"})
    with pytest.raises(Denied) as info:
        verify_token(rs_token, rules, keys)
    assert info.value.reason is Reason.ALGORITHM_NOT_ALLOWED


def test_kidless_tokens_need_a_kid_beyond_eight_candidates() -> None:
    now = time.time()
    keys = KeySet.of([hmac_key(HS_SECRET + bytes([i]), kid=f"k{i}") for i in range(9)])
    token = jwt.encode(claims(now), HS_SECRET + bytes([3]), algorithm="HS256")
    with pytest.raises(Denied) as info:
        verify_token(token, JwtRules(frozenset({"HS256"})), keys)
    assert info.value.reason is Reason.KID_REQUIRED
    small = KeySet.of(list(keys.keys[:8]))
    assert verify_token(token, JwtRules(frozenset({"HS256"})), small).exp > now
