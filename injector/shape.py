"""The injected sidecar's shape (:mod:`injector.patch`): paths, variables, ports, volumes.

The shape: one sidecar container per pod running the pod-local sidecar
agent (``meshplane-sidecar-agent``), which starts the sidecar Envoy
(:mod:`meshplane.sidecar_contract`: an inbound listener on the pod IP in
front of the app's port, an outbound listener on loopback). The agent
proves the pod's identity with the pod's projected service-account token
(audience :data:`~meshplane.workload_contract.TOKEN_AUDIENCE`), generates
the workload key in memory and serves Envoy ADS and SDS over Unix sockets in
an emptyDir only the sidecar container mounts; Envoy's admin API is a socket
there too. No cluster credential is mounted into the pod.
"""

from __future__ import annotations

from meshplane import sidecar_contract, workload_contract

#: The control plane's CA bundle (PEM), given by value (the agent writes it to its
#: socket directory): a CA certificate is public; a volume would need an object per
#: namespace.
CA_ENV = sidecar_contract.CONTROL_PLANE_CA_ENV
#: Downward-API variables the container's arguments expand (``$(POD_NAME)``): the pod's
#: name is only known once the pod is created (a Deployment's pods have a generateName).
POD_NAME_ENV = "POD_NAME"
#: The pod's IP: the sidecar's inbound address, which other sidecars reach it at.
POD_IP_ENV = "POD_IP"
#: The sidecar's inbound listener (mTLS from other sidecars; Istio's inbound port).
LISTEN_PORT = 15006
#: The sidecar's outbound listener on loopback, where the app sends its calls.
OUTBOUND_PORT = 15001
#: The sidecar's mTLS diagnostics port: the allow-listed admin API, for the cluster
#: agent's mesh certificate only (``diagnosticsCaller`` in the injector's config).
DIAGNOSTICS_PORT = sidecar_contract.DEFAULT_DIAGNOSTICS_PORT
#: The sidecar's metrics-only port: ``GET /stats/prometheus`` (container port name
#: :data:`METRICS_PORT_NAME`, which the ``meshplane-sidecars`` scrape job keeps).
PROMETHEUS_PORT = sidecar_contract.DEFAULT_PROMETHEUS_PORT
METRICS_PORT_NAME = "mesh-metrics"
#: The label an injected pod gets, which the cluster agent selects sidecars by
#: (``--selector``'s default; Istio's injector sets the same label).
PROXY_LABEL = ("security.istio.io/tlsMode", "istio")
#: Scrape annotations set on an injected pod that has none of its own.
PROMETHEUS_ANNOTATIONS = {
    "prometheus.io/scrape": "true",
    "prometheus.io/port": str(PROMETHEUS_PORT),
    "prometheus.io/path": "/stats/prometheus",
}
#: The app's port when the pod says it (else its first container's first port).
APP_PORT_ANNOTATION = "meshplane.io/app-port"
#: The projected token: where it is mounted, its audience and lifetime (the kubelet
#: rewrites the file at 80 % of it; the agent reads it again for every call).
TOKEN_PATH = workload_contract.DEFAULT_TOKEN_PATH
TOKEN_EXPIRATION_SECONDS = 3600
#: The agent's and Envoy's private directory (sockets, the bootstrap, the CA file).
SOCKET_DIR = workload_contract.DEFAULT_SOCKET_DIR
#: Volume names the patch adds; a pod that already has one is not injected.
TOKEN_VOLUME = "meshplane-token"  # noqa: S105 - a volume name
SOCKET_VOLUME = "meshplane-sockets"
#: The image's user (deploy/Dockerfile).
RUN_AS_USER = 10001
