"""Envoy ext_authz server: bearer-JWT policies over gRPC Check and HTTP mode.

Layers, from pure to wired (see docs/extauthz.md; an import-linter contract
in ``pyproject.toml`` keeps them):

* pure logic: ``reasons`` (decision + reason codes), ``paths`` (request-path
  normalization, path-claim decoding), ``keys`` (key material bound to an
  algorithm family), ``tokens`` (strict JWS parsing and verification),
  ``token_cache``, ``keyring``, ``jwt_policy`` (the engine), ``config``
  (strict YAML loading);
* adapters: ``jwks_remote`` (HTTP JWKS fetcher, off the hot path),
  ``service`` (fail-closed check + kid-miss wait), ``grpc_api``, ``http_api``,
  ``responses``, ``metrics``;
* wiring: ``app`` (the runtime's GrpcApp) and ``cli``.
"""
