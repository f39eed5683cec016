"""Policy distribution: the server half of ``PolicyDistribution``.

``feed`` wakes streams when the store's revision moves, ``registry`` remembers
what every subscribed instance applied (the answer to "has my change reached
the proxies?"), and ``server`` is the gRPC servicer that ties them together.
"""
