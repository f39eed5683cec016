"""The transport-independent check: live engine, kid-miss wait, fail-closed wrapper.

Both adapters call ``AuthorizationService.check``. It owns three things the
pure engine cannot:

* the **live engine**, swapped in one assignment when the config reloads;
* the **kid-miss wait**: when a token names a key we do not have and a remote
  JWKS agreed to refetch (rate-limited), the request waits up to that
  source's ``kidMissWaitSeconds`` for the fetch and is decided once more. A
  short wait turns the first requests after an IdP key rotation into allows
  instead of 403s, while the rate limit and the cap keep a flood of random
  kids from holding requests (only requests that overlap a permitted refetch
  wait; all others are denied at once);
* the **fail-closed guarantee**: any exception becomes an explicit
  ``internal_error`` deny, logged with its type, never an allow.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from time import perf_counter  # one global, not time's attribute, on every check

from extauthz import metrics
from extauthz.jwt_policy import CheckAttributes, CompiledPolicy, Engine
from extauthz.reasons import Decision, Reason, deny

log = logging.getLogger(__name__)

INTERNAL_ERROR = deny(Reason.INTERNAL_ERROR)
_REFETCH_REASONS = frozenset({Reason.UNKNOWN_KID, Reason.NO_KEYS})


class AuthorizationService:
    def __init__(self, engine: Engine, clock: Callable[[], float] = time.time) -> None:
        self.engine = engine
        self.clock = clock

    def swap(self, engine: Engine) -> None:
        """Install a new engine; in-flight checks finish on the old one."""
        self.engine = engine

    async def _after_kid_miss(
        self, engine: Engine, attrs: CheckAttributes, decision: Decision
    ) -> Decision:
        """Wait (bounded) for a permitted JWKS refetch, then decide once more."""
        selected = engine.select(attrs)
        if not isinstance(selected, CompiledPolicy) or not selected.keyring.has_remotes:
            return decision
        pending = selected.keyring.request_refetch()
        if pending is None:
            return decision
        fetch, wait = pending
        if wait <= 0:
            return decision
        try:
            async with asyncio.timeout(wait):
                await asyncio.shield(fetch)
        except TimeoutError:
            return decision
        return engine.decide(attrs, self.clock())

    def check_now(self, attrs: CheckAttributes, mode: str) -> Decision | None:
        """:meth:`check` without a coroutine, for the usual check, which never
        waits: the decision (counted, never raising), or None for a key-id
        miss that a JWKS refetch may cure; then call :meth:`check`, which
        decides again and may wait."""
        started = perf_counter()
        try:
            decision = self.engine.decide(attrs, self.clock())
            if not decision.allowed and decision.reason in _REFETCH_REASONS:
                return None
        except Exception as exc:
            log.error("check failed; denying", extra={"error": type(exc).__name__})
            decision = INTERNAL_ERROR
        self._record(mode, decision, started)
        return decision

    async def check(self, attrs: CheckAttributes, mode: str) -> Decision:
        """Decide, count, and never raise: failures are an explicit deny."""
        started = perf_counter()
        try:
            engine = self.engine
            decision = engine.decide(attrs, self.clock())
            if not decision.allowed and decision.reason in _REFETCH_REASONS:
                decision = await self._after_kid_miss(engine, attrs, decision)
        except Exception as exc:
            log.error("check failed; denying", extra={"error": type(exc).__name__})
            decision = INTERNAL_ERROR
        self._record(mode, decision, started)
        return decision

    def _record(self, mode: str, decision: Decision, started: float) -> None:
        """Count the decision (and log a deny at debug level); never raises."""
        try:
            metrics.record_check(mode, decision, perf_counter() - started)
            if not decision.allowed and log.isEnabledFor(logging.DEBUG):
                log.debug(
                    "denied",
                    extra={
                        "reason": decision.reason.value,
                        "policy": decision.policy,
                        "mode": mode,
                    },
                )
        except Exception:  # metrics must never turn a decision into an error
            log.exception("recording a check failed")
