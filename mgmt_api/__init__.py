"""meshplane's management plane: the REST API under ``/v2`` (see docs/api.md).

Layers: pure domain logic (``fqn``, ``domain/``, ``errors``) -> store
(``store/``) -> use cases (``service/``) -> HTTP adapters (``routes/``,
``middleware``) -> wiring (``app``, ``cli``). ``kinds`` is the registry every
layer reads to know which resource kinds exist and where they live.
"""
