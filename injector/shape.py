"""The injected sidecar's shape, shared by the patch (:mod:`injector.patch`) and the
process that runs in it (:mod:`injector.sidecar`): paths, variables, ports.

Today's shape (before the mesh issue, #24): a gateway-shaped Envoy per pod
that authenticates to mgmt-api's ADS with the cluster's credentials. What
the mesh issue adds (a SPIFFE identity over SDS instead of the cluster key,
inbound/outbound listeners) changes :data:`CREDENTIALS_DIR` and the
bootstrap, not the webhook.
"""

from __future__ import annotations

#: Where the cluster credentials Secret is mounted (read-only, in the sidecar only).
CREDENTIALS_DIR = "/etc/meshplane/credentials"
#: In-memory emptyDir where the sidecar writes its bootstrap (it holds a token).
BOOTSTRAP_DIR = "/run/meshplane"
#: The control plane's CA bundle (PEM), given by value: the sidecar writes it next to
#: the bootstrap. A CA certificate is public; a volume would need an object per namespace.
CA_ENV = "MESHPLANE_CONTROL_PLANE_CA"
#: Downward-API variables: the pod's name is only known once the pod is created
#: (a Deployment's pods have a generateName), so the sidecar reads it at start.
POD_NAME_ENV = "POD_NAME"
POD_NAMESPACE_ENV = "POD_NAMESPACE"
SERVICE_ACCOUNT_ENV = "POD_SERVICE_ACCOUNT"
#: The port of the gateway-shaped listener mgmt-api gives the sidecar (Istio's inbound port).
LISTEN_PORT = 15006
#: Volume names the patch adds; a pod that already has one is not injected.
CREDENTIALS_VOLUME = "meshplane-credentials"
BOOTSTRAP_VOLUME = "meshplane-bootstrap"
#: The image's user (deploy/Dockerfile).
RUN_AS_USER = 10001
#: The ``node.metadata`` key of what only a sidecar has (namespace, service account,
#: app, pod), beside the gateway keys of :mod:`meshplane.gateway_contract`.
SIDECAR_METADATA_KEY = "meshplane.sidecar"
