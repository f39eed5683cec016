"""The pod-local sidecar agent: the workload's key, its certificate, Envoy's SDS and ADS."""
