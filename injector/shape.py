"""The injected sidecar's shape, shared by the patch (:mod:`injector.patch`) and the
process that runs in it (:mod:`injector.sidecar`): paths, variables, ports.

The shape: a sidecar Envoy per pod (:mod:`meshplane.sidecar_contract`: an
inbound listener on the pod IP in front of the app's port, an outbound
listener on loopback) that authenticates to mgmt-api's ADS with the
cluster's credentials and receives its SPIFFE certificate over SDS.
A per-workload credential instead of the cluster key is not built yet
(docs/mesh.md).
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
#: The pod's IP: the sidecar's inbound address, which other sidecars reach it at.
POD_IP_ENV = "POD_IP"
#: The sidecar's inbound listener (mTLS from other sidecars; Istio's inbound port).
LISTEN_PORT = 15006
#: The sidecar's outbound listener on loopback, where the app sends its calls.
OUTBOUND_PORT = 15001
#: The app's port when the pod says it (else its first container's first port).
APP_PORT_ANNOTATION = "meshplane.io/app-port"
#: Volume names the patch adds; a pod that already has one is not injected.
CREDENTIALS_VOLUME = "meshplane-credentials"
BOOTSTRAP_VOLUME = "meshplane-bootstrap"
#: The image's user (deploy/Dockerfile).
RUN_AS_USER = 10001
