"""Identity: OIDC login, device-code and token-exchange rules, directory sync.

The package is layered so each part is testable on its own:

* pure logic (no I/O, the clock passed in): ``pkce``, ``login_state``,
  ``login_code``, ``claims``, ``redirects``, ``error_page``,
  ``user_mapping``, ``sync.reconcile`` (the RFC 8628 polling rules live in
  ``meshplane.oauth_device``, shared with meshctl);
* adapters that talk to the outside world: ``discovery``, ``jwks``, ``oidc``
  (the provider's token endpoint), ``token_exchange``, ``sync.graph``,
  ``sync.ldap``, ``sql_store``;
* wiring that the REST layer calls: ``config`` (install config),
  ``service``, ``runtime`` and ``sync.runner``.

This ``__init__`` imports nothing on purpose, so that importing one module
(a pure rule in a test, say) does not drag in httpx, SQLAlchemy or ldap3.
"""
