"""The policy file shared by the engine tests and the server tests."""

from __future__ import annotations

import json
from pathlib import Path

from .jwtkit import HS_SECRET, ec_key, public_jwk, public_pem, rsa_key

POLICY_YAML = """
defaultPolicy: hs
tokenCacheSize: 1000
policies:
  - name: hs
    jwt:
      algorithms: [HS256]
      keys:
        - hmacSecret: {file: hs.secret}
    pathClaim: {name: path, match: PREFIX}
  - name: seg
    jwt:
      algorithms: [HS256]
      keys:
        - hmacSecret: {env: EXTAUTHZ_TEST_SECRET}
    pathClaim: {match: SEGMENT}
  - name: rs
    jwt:
      algorithms: [RS256]
      keys:
        - publicKeyPem: {file: rsa.pem}
    pathClaim: {name: path}
  - name: mixed
    jwt:
      algorithms: [HS256, RS256]
      keys:
        - hmacSecret: {file: hs.secret}
        - publicKeyPem: {file: rsa.pem}
    pathClaim: {name: path}
  - name: es
    jwt:
      algorithms: [ES256]
      keys:
        - jwks: {file: es.jwks.json}
    pathClaim: {name: path}
  - name: iss
    jwt:
      algorithms: [HS256]
      keys:
        - hmacSecret: {file: hs.secret}
      issuer: https://idp.example
      audiences: [api, other]
      leewaySeconds: 30
  - name: hdr
    jwt:
      algorithms: [HS256]
      keys:
        - hmacSecret: {file: hs.secret}
    pathClaim: {name: path}
    removeAuthorization: true
    claimsToHeaders:
      - {claim: sub, header: x-jwt-sub}
      - {claim: tier, header: x-jwt-tier}
      - {claim: groups, header: x-jwt-groups}
  - name: tsb
    jwt:
      algorithms: [HS256]
      keys:
        - hmacSecret: {value: secret}
    pathClaim: {name: path, match: PREFIX}
"""


def write_policies(directory: Path, monkeypatch_env: dict[str, str] | None = None) -> Path:
    """Write the policy file and its key files into ``directory``."""
    (directory / "hs.secret").write_bytes(HS_SECRET)
    (directory / "rsa.pem").write_bytes(public_pem(rsa_key()))
    jwks = {"keys": [public_jwk(ec_key(), "es-1", "ES256")]}
    (directory / "es.jwks.json").write_text(json.dumps(jwks))
    path = directory / "policies.yaml"
    path.write_text(POLICY_YAML)
    return path
