"""Install-config files for tests: ``spec.identityProvider`` pointing at the test servers."""

from __future__ import annotations

import textwrap
from pathlib import Path

from tests.support.oidc_provider.launcher import (
    API_V2,
    DEVICE_CLIENT_ID,
    EXCHANGE_CLIENT_ID,
    WEB_CLIENT_ID,
    WEB_CLIENT_SECRET,
    RunningProvider,
)


def oidc_section(
    directory: Path, provider: RunningProvider, callback: str, *, extra: str = ""
) -> str:
    """The ``oidc`` list: one configuration ``corp`` for the provider's fixed clients.

    Token exchange accepts the audience the test provider puts into its v2
    access tokens (``API_V2``); ``extra`` is appended to the entry (YAML lines
    indented like its other keys, e.g. a ``users`` block)."""
    secret = directory / "client-secret"
    secret.write_text(WEB_CLIENT_SECRET + "\n")
    return textwrap.dedent(
        f"""\
        oidc:
          - name: corp
            clientId: {WEB_CLIENT_ID}
            clientSecret: {{file: {secret}}}
            providerConfig:
              dynamic:
                configurationUri: {provider.configuration_uri}
            redirectUri: {callback}
            scopes: [email, profile, offline_access]
            offlineAccessConfig:
              deviceCodeAuth: {{clientId: {DEVICE_CLIENT_ID}}}
              tokenExchange: {{clientId: {EXCHANGE_CLIENT_ID}, audience: "{API_V2}"}}
        """
    ) + textwrap.indent(textwrap.dedent(extra), "    ")


def write_install_config(directory: Path, *sections: str) -> Path:
    """``spec.identityProvider`` made of ``sections`` (YAML blocks such as ``oidc_section``)."""
    body = "".join(textwrap.indent(s, "    ") for s in sections)
    config = directory / "install.yaml"
    config.write_text("spec:\n  identityProvider:\n" + body)
    return config
