"""Global rate-limit service for Envoy (envoy.service.ratelimit.v3).

Layers, from pure to wired (an import-linter contract in ``pyproject.toml``
keeps them):

- ``config`` / ``units``: envoyproxy/ratelimit's YAML into immutable snapshots;
- ``matching``: request descriptor + domain config → the limit and its bucket;
- ``buckets``: epoch-aligned windows and the (Cluster-safe) keys of counters;
- ``plan``: a RateLimitRequest → validated, matched, merged buckets;
- ``store``: the atomic all-or-nothing decision rule and its stores
  (``memory``, ``redis`` + ``resp``, ``local_cache``);
- ``response`` / ``headers``: statuses and the x-ratelimit headers;
- ``service``: the decision with metrics and failure modes;
- ``grpc_api``, ``app``, ``cli``: the gRPC adapter and the process wiring.

See docs/ratelimit.md.
"""
