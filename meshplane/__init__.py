"""Shared runtime of meshplane's services.

Everything the gRPC services have in common lives here exactly once: the
worker-process model (``server``), Prometheus metrics that are correct across
workers (``metrics``), JSON logging (``logging``), and validated config
snapshots that are swapped live (``config_source``, ``yamlconf``).
"""
