"""``POST /mutate``: one AdmissionReview in, one answer out (status, JSON body).

Wires the pure parts (:mod:`injector.review`, :mod:`injector.decision`,
:mod:`injector.patch`) with the metrics and the log. It never raises: an
unexpected error while building a patch admits the pod unpatched with a
warning, so a bug in the injector cannot block or break a workload.
"""

from __future__ import annotations

import logging
from typing import Any

from injector import patch, review
from injector.config import InjectorConfig
from injector.decision import Reason, decide
from injector.metrics import InjectorMetrics

log = logging.getLogger("injector")

JSON = "application/json"


class Webhook:
    def __init__(
        self, config: InjectorConfig, ca_pem: str | None, metrics: InjectorMetrics
    ) -> None:
        self.config = config
        self.ca_pem = ca_pem
        self.metrics = metrics

    def refuse(
        self, status: int, error: review.BadReview, reason: str
    ) -> tuple[int, dict[str, Any]]:
        """A 4xx for a body that is no review; counted and logged (without the body)."""
        self.metrics.reviews.labels("refused", reason).inc()
        log.warning(
            "admission review refused",
            extra={"status": status, "error": error.message, "field": error.field},
        )
        return status, error.body()

    def mutate(self, body: bytes, content_type: str | None) -> tuple[int, dict[str, Any]]:
        media = (content_type or "").partition(";")[0].strip().lower()
        if media != JSON:
            error = review.BadReview(f"Content-Type must be {JSON}", "Content-Type")
            return self.refuse(415, error, "content-type")
        try:
            parsed = review.parse(body)
        except review.BadReview as exc:
            return self.refuse(400, exc, "malformed")
        try:
            answer, result, reason = self._answer(parsed)
        except Exception as exc:  # a bug must not block pods: admit unpatched, say so
            log.exception("cannot build the patch; admitting the pod without the sidecar")
            answer = review.allow(parsed.uid, [f"meshplane sidecar not injected: {exc}"])
            result, reason = "unsafe", "error"
        self.metrics.reviews.labels(result, reason).inc()
        log.info(
            "admission review",
            extra={
                "uid": parsed.uid,
                "namespace": parsed.namespace,
                "result": result,
                "reason": reason,
                "dry_run": parsed.dry_run,
            },
        )
        return 200, answer

    def _answer(self, parsed: review.Review) -> tuple[dict[str, Any], str, str]:
        if not review.is_pod_create(parsed):
            return review.allow(parsed.uid), "skipped", Reason.NOT_A_POD_CREATE
        try:
            facts = patch.facts(parsed.namespace, parsed.object)
            decision = decide(facts, self.config)
            if not decision.inject:
                return review.allow(parsed.uid), "skipped", decision.reason
            ops = patch.operations(parsed.object, facts, self.config, self.ca_pem)
        except patch.Unsafe as exc:
            warning = f"meshplane sidecar not injected: {exc}"
            return review.allow(parsed.uid, [warning]), "unsafe", Reason.UNSAFE
        return review.patched(parsed.uid, ops), "injected", Reason.INJECTED
