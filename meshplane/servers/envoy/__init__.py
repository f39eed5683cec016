"""The Envoy backend: an Envoy per worker runs the app through pyvoy's ASGI module."""
