"""The server backends: each runs a service's :class:`~meshplane.server_contract.GrpcApp`.

``envoy/`` runs the app inside Envoy (pyvoy); ``h2/`` speaks HTTP/2 itself.
What they agree on is :mod:`meshplane.server_contract`; the supervisor that
picks one is :mod:`meshplane.server`.
"""
