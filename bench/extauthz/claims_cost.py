"""The Python cost of publishing verified claims on an allow (per-identity rate limits).

Prints, per call, in one process and one run, interleaved over rounds:

- ``decide``: the engine's decision for a cached token, without and with
  ``claimsToMetadata: [sub, org]`` (the claims are part of the cached allow,
  so the two should match);
- ``encode``: the CheckResponse bytes for a plain allow (prebuilt, the
  baseline), an allow with two claims as built on every call (what the
  adapter did before the encoding was cached), and through the adapter's cache.

    uv run --frozen python bench/extauthz/claims_cost.py [--rounds 3] [--calls 200000]

Figures from a shared 2-core machine are noisy: note ``uptime`` beside them.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable

import jwt

from extauthz.config import parse_config
from extauthz.grpc_api import encode_response, response_for
from extauthz.jwt_policy import CheckAttributes, Engine

SECRET = "bench-claims-secret-0123456789abcdef"
POLICY = """defaultPolicy: p
policies:
  - name: p
    jwt:
      algorithms: [HS256]
      keys: [{hmacSecret: {value: %s}}]
"""


def per_call(fn: Callable[[], object], calls: int) -> float:
    started = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - started) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=200_000)
    args = parser.parse_args()
    now = time.time()
    token = jwt.encode(
        {"sub": "alice", "org": "acme", "nbf": int(now), "exp": int(now) + 3600},
        SECRET,
        algorithm="HS256",
    )
    attrs = CheckAttributes("/x", (f"Bearer {token}",), None)
    plain = Engine(parse_config(POLICY % SECRET, "plain.yaml"))
    claims = Engine(
        parse_config(POLICY % SECRET + "    claimsToMetadata: [sub, org]\n", "claims.yaml")
    )
    plain_allow = plain.decide(attrs, now)
    claims_allow = claims.decide(attrs, now)
    assert claims_allow.claims_metadata == (("sub", "alice"), ("org", "acme"))
    cases: dict[str, Callable[[], object]] = {
        "decide, no claims": lambda: plain.decide(attrs, now),
        "decide, 2 claims": lambda: claims.decide(attrs, now),
        "encode, plain allow": lambda: encode_response(plain_allow),
        "encode, 2 claims, built per call": lambda: response_for(claims_allow).SerializeToString(),
        "encode, 2 claims, cached": lambda: encode_response(claims_allow),
    }
    results: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.rounds):
        for name, fn in cases.items():
            results[name].append(per_call(fn, args.calls))
    print(f"load average {os.getloadavg()[0]:.2f}; us per call, {args.rounds} rounds")
    for name, figures in results.items():
        print(f"  {name:34s} " + "  ".join(f"{f:6.2f}" for f in figures))


if __name__ == "__main__":
    main()
