"""Whether a pod gets the sidecar, and why: pure, table-tested (tests/injector/test_decision.py).

The webhook's ``namespaceSelector`` already sends only onboarded namespaces
(``meshplane.io/injection: enabled`` or ``istio-injection: enabled``) and its
``objectSelector`` already drops opted-out pods; this decision checks both
again from what the review carries, so a hand-edited or stale webhook
configuration can never inject into a system namespace or an opted-out pod.
Namespace *labels* are not in an AdmissionReview: onboarding itself is the
selector's job, the system-namespace list is enforced here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from injector.config import InjectorConfig

#: The injected container's name; a pod with a container of that name is not injected again.
SIDECAR_CONTAINER = "meshplane-sidecar"
#: Annotation the injector sets on the pods it patched (what, and which injector version).
STATUS_ANNOTATION = "sidecar.meshplane.io/status"


class Reason(StrEnum):
    """Why a pod was or was not injected: the ``reason`` label of the reviews metric."""

    INJECTED = "injected"
    SYSTEM_NAMESPACE = "system-namespace"
    OPTED_OUT_LABEL = "opted-out-label"
    OPTED_OUT_ANNOTATION = "opted-out-annotation"
    ALREADY_INJECTED = "already-injected"
    HOST_NETWORK = "host-network"
    NOT_A_POD_CREATE = "not-a-pod-create"
    UNSAFE = "unsafe"


@dataclass(frozen=True)
class PodFacts:
    """What the decision reads from a review: nothing else of the pod matters to it."""

    namespace: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    container_names: Sequence[str]
    host_network: bool = False


@dataclass(frozen=True)
class Decision:
    inject: bool
    reason: Reason


def opted_out(value: str | None) -> bool:
    """``"false"`` (any case, surrounding blanks ignored) opts out; anything else does not."""
    return value is not None and value.strip().lower() == "false"


def decide(pod: PodFacts, config: InjectorConfig) -> Decision:
    """Inject or not; the first rule that says no wins, in the order of the table below.

    1. a system namespace (spec 2.1) is never touched;
    2. the opt-out label, then the opt-out annotation, with value ``"false"``;
    3. a pod that already has the sidecar (container or status annotation) is left alone,
       so a re-sent review or a second webhook pass changes nothing;
    4. a host-network pod is not injected: its sidecar's ports would be the node's.
    """
    if pod.namespace in config.system_namespaces:
        return Decision(False, Reason.SYSTEM_NAMESPACE)
    if opted_out(pod.labels.get(config.opt_out_label)):
        return Decision(False, Reason.OPTED_OUT_LABEL)
    if opted_out(pod.annotations.get(config.opt_out_label)):
        return Decision(False, Reason.OPTED_OUT_ANNOTATION)
    if SIDECAR_CONTAINER in pod.container_names or STATUS_ANNOTATION in pod.annotations:
        return Decision(False, Reason.ALREADY_INJECTED)
    if pod.host_network:
        return Decision(False, Reason.HOST_NETWORK)
    return Decision(True, Reason.INJECTED)
