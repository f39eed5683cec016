"""Identity: OIDC login, device-code and token-exchange rules, directory sync.

The package is layered so each part is testable on its own:

* pure logic (no I/O, the clock passed in): ``pkce``, ``login_state``,
  ``claims``, ``error_page``, ``device_flow`` (the RFC 8628 polling rules),
  ``sync.reconcile``;
* adapters that talk to the outside world: ``discovery``, ``jwks``, ``oidc``
  (the provider's token endpoint), ``device_code``, ``token_exchange``,
  ``sync.graph``, ``sync.ldap``;
* wiring that the REST layer calls: ``config`` (install config) and
  ``sync.runner``.

This ``__init__`` imports nothing on purpose: ``device_code`` is reused by
``meshctl`` and must stay importable without FastAPI or SQLAlchemy.
"""
