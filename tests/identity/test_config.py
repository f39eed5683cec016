"""spec.identityProvider: parsing, environment overrides and strict errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from meshplane.config_error import ConfigError
from mgmt_api.identity.config import load_identity_provider
from mgmt_api.identity.secrets import Secret, SecretRef, SecretUnavailableError

FULL = """\
spec:
  identityProvider:
    oidc:
      - name: corp
        clientId: web
        clientSecret: {file: SECRET_FILE}
        providerConfig: {dynamic: {configurationUri: https://idp.example/.well-known/openid-configuration}}
        redirectUri: https://mp.example:8443/iam/v2/oidc/callback
        offlineAccessConfig:
          deviceCodeAuth: {clientId: cli}
          tokenExchange: {clientId: robot}
      - name: partners
        clientId: web2
        clientSecret: {env: PARTNER_SECRET}
        providerConfig: {dynamic: {configurationUri: https://other.example/.well-known/openid-configuration}}
        redirectUri: https://mp.example:8443/iam/v2/oidc/partners/callback
        scopes: [email]
    sync:
      interval: 15m
      organizations: [acme, partners]
      ldap:
        url: ldaps://ldap.example:636
        bindDn: cn=sync,dc=example
        bindPassword: {env: LDAP_PASSWORD}
        userBase: ou=people,dc=example
        groupBase: ou=groups,dc=example
        attributes: {userId: sAMAccountName, member: uniqueMember}
        pageSize: 200
"""


def write(tmp_path: Path, text: str) -> Path:
    secret = tmp_path / "secret"
    secret.write_text("s3cret\n")
    path = tmp_path / "install.yaml"
    path.write_text(text.replace("SECRET_FILE", str(secret)))
    return path


def test_full_config_is_parsed(tmp_path: Path) -> None:
    config = load_identity_provider(write(tmp_path, FULL), environ={})
    corp, partners = config.oidc
    assert config.oidc_named(None) is corp and config.oidc_named("partners") is partners
    assert config.oidc_named("nope") is None
    assert corp.scopes == ("email", "profile", "offline_access")
    assert corp.request_scopes == ("openid", "email", "profile", "offline_access")
    assert (corp.device_code_client_id, corp.token_exchange_client_id) == ("cli", "robot")
    assert partners.device_code_client_id is None and partners.scopes == ("email",)
    assert corp.client_secret.read() == Secret("s3cret")
    assert (
        config.sync is not None
        and config.sync.interval_s == 900
        and config.sync.source_type == "LDAP"
    )
    assert config.sync.ldap is not None
    assert config.sync.ldap.attributes.user_id == "sAMAccountName"
    assert config.sync.ldap.attributes.member == "uniqueMember"
    assert config.sync.ldap.page_size == 200
    assert config.sync.organizations == ("acme", "partners")


def test_single_mapping_form_of_the_spec_is_named_default(tmp_path: Path) -> None:
    text = """\
spec:
  identityProvider:
    oidc:
      clientId: web
      clientSecret: {env: OIDC_SECRET}
      providerConfig: {dynamic: {configurationUri: https://idp.example/.well-known/openid-configuration}}
      redirectUri: https://mp.example:8443/iam/v2/oidc/callback
    sync:
      organizations: [acme]
      azure: {clientId: app, tenantId: contoso.onmicrosoft.com, clientSecret: {env: AZ}}
"""
    config = load_identity_provider(write(tmp_path, text), environ={})
    assert [c.name for c in config.oidc] == ["default"]
    assert config.sync is not None and config.sync.azure is not None
    assert config.sync.azure.graph_base_url == "https://graph.microsoft.com"
    assert config.sync.interval_s == 3600


def test_new_fields_and_their_defaults(tmp_path: Path) -> None:
    config = load_identity_provider(write(tmp_path, FULL), environ={})
    corp, partners = config.oidc
    # Token exchange: the default audience is the management plane's own app.
    assert corp.token_exchange_audiences == {"api://web", "web"}
    # The default configuration logs in the pull sync's users; others only bound ones.
    assert (corp.user_source_types, corp.user_organizations) == (("LDAP",), ("acme", "partners"))
    assert (partners.user_source_types, partners.user_organizations) == ((), ())
    # The login cookie follows the public callback (a proxy prefix, TLS at the proxy).
    assert (corp.cookie_path, corp.cookie_secure) == ("/iam/v2/oidc/callback", True)
    assert config.sync is not None and config.sync.max_delete_percent == 50
    assert config.sync.ldap is not None and not config.sync.ldap.start_tls

    text = (
        FULL.replace(
            "tokenExchange: {clientId: robot}",
            "tokenExchange: {clientId: robot, audience: [api://mp, mp-id]}",
        )
        .replace(
            "        scopes: [email]\n",
            "        scopes: [email]\n        users: {sourceTypes: [AZURE], organizations: [p]}\n",
        )
        .replace("interval: 15m", "interval: 15m\n      maxDeletePercent: 10")
        .replace(
            "url: ldaps://ldap.example:636",
            "url: ldap://ldap.example\n        startTls: true\n        caFile: /etc/ca.pem",
        )
        .replace("oidc/partners/callback", "oidc/callback?name=partners")
    )
    config = load_identity_provider(write(tmp_path, text), environ={})
    corp, partners = config.oidc
    assert corp.token_exchange_audiences == {"api://mp", "mp-id"}
    assert (partners.user_source_types, partners.user_organizations) == (("AZURE",), ("p",))
    assert config.sync is not None and config.sync.max_delete_percent == 10
    assert config.sync.ldap is not None
    assert (config.sync.ldap.start_tls, config.sync.ldap.ca_file) == (True, "/etc/ca.pem")


def test_missing_section_means_disabled(tmp_path: Path) -> None:
    config = load_identity_provider(write(tmp_path, "spec: {}\n"), environ={})
    assert not config.oidc_enabled and config.sync is None


def test_environment_overrides_apply_before_validation(tmp_path: Path) -> None:
    env = {
        "MESHPLANE_IDENTITYPROVIDER__OIDC__CORP__CLIENTID": "from-env",
        "MESHPLANE_IDENTITYPROVIDER__OIDC__PARTNERS__SCOPES": "[profile, email]",
        "MESHPLANE_IDENTITYPROVIDER__SYNC__INTERVAL": "2h",
        "MESHPLANE_IDENTITYPROVIDER__SYNC__LDAP__USERFILTER": "(objectClass=person)",
    }
    config = load_identity_provider(write(tmp_path, FULL), environ=env)
    assert config.oidc[0].client_id == "from-env"
    assert config.oidc[1].scopes == ("profile", "email")
    assert config.sync is not None and config.sync.interval_s == 7200
    assert config.sync.ldap is not None and config.sync.ldap.user_filter == "(objectClass=person)"

    with pytest.raises(ConfigError, match="no entry named 'nobody'"):
        load_identity_provider(
            write(tmp_path, FULL),
            environ={"MESHPLANE_IDENTITYPROVIDER__OIDC__NOBODY__CLIENTID": "x"},
        )
    with pytest.raises(ConfigError, match="unknown field"):
        load_identity_provider(
            write(tmp_path, FULL), environ={"MESHPLANE_IDENTITYPROVIDER__SYNC__BOGUS": "x"}
        )
    with pytest.raises(ConfigError, match="scopes"):
        load_identity_provider(
            write(tmp_path, FULL),
            environ={"MESHPLANE_IDENTITYPROVIDER__OIDC__CORP__SCOPES": "[groups]"},
        )


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("clientId: web\n", "clientID: web\n", "unknown key 'clientID' (did you mean 'clientId'?)"),
        ("clientSecret: {file: SECRET_FILE}", "clientSecret: hunter2", "not a literal"),
        ("clientSecret: {file: SECRET_FILE}", "clientSecret: {file: a, env: B}", "exactly one"),
        (
            "redirectUri: https://mp.example:8443/iam/v2/oidc/callback",
            "redirectUri: http://mp.example/cb",
            "https",
        ),
        ("scopes: [email]", "scopes: [email, groups]", "unknown scope 'groups'"),
        ("scopes: [email]", "scopes: [email, email]", "twice"),
        ("name: partners", "name: corp", "unique"),
        ("name: partners", "name: Partners_1", "DNS-1123"),
        ("interval: 15m", "interval: 1s", "at least"),
        ("      organizations: [acme, partners]\n", "", "organizations: is required"),
        ("organizations: [acme, partners]", "organizations: []", "at least one organization"),
        ("organizations: [acme, partners]", "organizations: [Acme]", "DNS-1123"),
        ("organizations: [acme, partners]", "organizations: [acme, acme]", "unique"),
        ("interval: 15m", "interval: soon", "not a duration"),
        ("url: ldaps://ldap.example:636", "url: https://ldap.example", "ldap/ldaps"),
        ("pageSize: 200", "pageSize: 0", "1 to 10000"),
        ("        groupBase: ou=groups,dc=example\n", "", "groupBase: is required"),
        (
            "    sync:\n",
            "    sync:\n      azure: {clientId: a, tenantId: t, clientSecret: {env: X}}\n",
            "exactly one source",
        ),
        # The callback must be the configuration's route (the cookie path derives from it).
        (
            "iam/v2/oidc/callback",
            "iam/v2/oidc/callback/x",
            "ending in /v2/oidc/callback or /v2/oidc/corp/callback",
        ),
        ("oidc/partners/callback", "oidc/callback", "ending in /v2/oidc/partners/callback"),
        ("oidc/partners/callback", "oidc/corp/callback", "ending in /v2/oidc/partners/callback"),
        (
            "tokenExchange: {clientId: robot}",
            "tokenExchange: {clientId: robot, audience: []}",
            "must not be empty",
        ),
        (
            "tokenExchange: {clientId: robot}",
            "tokenExchange: {clientId: robot, aud: x}",
            "unknown key 'aud'; allowed: audience, clientId",
        ),
        (
            "scopes: [email]",
            "scopes: [email]\n        users: {sourceTypes: [MANUAL]}",
            "not a directory source type",
        ),
        ("interval: 15m", "interval: 15m\n      maxDeletePercent: 101", "0 to 100"),
        ("url: ldaps://ldap.example:636", "url: ldap://ldap.example", "startTls: true"),
        (
            "url: ldaps://ldap.example:636",
            "url: ldaps://ldap.example:636\n        startTls: true",
            "StartTLS is for ldap://",
        ),
        ("url: ldaps://ldap.example:636", "url: ldap://localhost:389", "startTls: true"),
    ],
)
def test_invalid_configs_name_the_field_and_line(
    tmp_path: Path, old: str, new: str, message: str
) -> None:
    assert old in FULL
    with pytest.raises(ConfigError) as error:
        load_identity_provider(write(tmp_path, FULL.replace(old, new, 1)), environ={})
    text = str(error.value)
    assert message in text
    assert text.startswith(str(tmp_path / "install.yaml"))
    assert "spec.identityProvider" in text
    assert "hunter2" not in text


def test_unknown_key_error_has_its_line(tmp_path: Path) -> None:
    text = FULL.replace("        pageSize: 200\n", "        pageSize: 200\n        pagesize: 3\n")
    with pytest.raises(ConfigError) as error:
        load_identity_provider(write(tmp_path, text), environ={})
    line = text.splitlines().index("        pagesize: 3") + 1
    assert error.value.line == line
    assert error.value.field == "spec.identityProvider.sync.ldap.pagesize"


def test_secrets_never_print_and_fail_clearly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MY_SECRET", "value-123")
    secret = SecretRef("env", "MY_SECRET").read()
    assert secret.reveal() == "value-123"
    assert (
        "value-123" not in repr(secret)
        and "value-123" not in str(secret)
        and "value-123" not in f"{[secret]}"
    )
    with pytest.raises(SecretUnavailableError, match="MISSING_SECRET is not set"):
        SecretRef("env", "MISSING_SECRET").read()
    with pytest.raises(SecretUnavailableError, match="cannot read"):
        SecretRef("file", str(tmp_path / "absent")).read()
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(SecretUnavailableError, match="empty"):
        SecretRef("file", str(tmp_path / "empty")).read()
