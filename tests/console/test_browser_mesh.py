"""The mesh in the console, in headless Chromium against a real mesh.

One stack for the file (:class:`tests.support.mesh.MeshStack`): mgmt-api,
ratelimit and extauthz, and two workloads behind real sidecar Envoys (``web``
in ``shop``, ``pay`` in ``billing``). A SecuritySetting selecting ``shop``
has mode NAMESPACE and one local JWT rule. The pages show what the API's
workloads view says: identities, certificate expiry, ACK state, callers,
the trust domain and the mesh namespaces, the setting's local rules, and a
diagnostics picker that names each sidecar (and says so when the cluster's
agent does not serve its diagnostics).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm
from playwright.sync_api import expect

from tests.console.conftest import Shots, fresh_page
from tests.mgmt_api.harness import ADMIN_PASSWORD
from tests.support.gateway import CLUSTER, ORG
from tests.support.mesh import TRUST_DOMAIN, MeshStack

#: A mesh stack (three Envoys and four services) starts in the first test's setup.
pytestmark = pytest.mark.timeout(300)
CLUSTER_UI = f"/ui/o/{ORG}/c/{CLUSTER}"
GROUP_UI = f"/ui/o/{ORG}/t/t/w/w/g/g"
ISSUER = "https://idp.test"

expect.set_options(timeout=60_000)


def _jwks() -> str:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public = json.loads(RSAAlgorithm.to_jwk(key.public_key()))
    return json.dumps({"keys": [{**public, "kid": "k1", "alg": "RS256", "use": "sig"}]})


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MeshStack]:
    stack = MeshStack(Path(tmp_path_factory.mktemp("console-mesh")))
    try:
        stack.workload("web", "shop", "web")
        stack.workload("pay", "billing", "pay")
        group = stack.group(stack.workspace("w", "shop"), "g")
        to = [{"paths": ["/api/*"], "methods": ["GET"]}]
        rules = [{"from": [{"jwt": {"iss": ISSUER, "sub": "alice"}}], "to": to}]
        local = {"rules": rules, "keys": {"jwks": {"value": _jwks()}}}
        stack.setting(group, {"mode": "NAMESPACE", "http": {"local": local}})
        stack.sidecars_converged()
        yield stack
    finally:
        stack.close()


@pytest.fixture(scope="module")
def page(browser: Any, mesh: MeshStack) -> Iterator[Any]:
    assert mesh.mgmt is not None
    signed_in = fresh_page(browser, mesh.mgmt.url, "admin", ADMIN_PASSWORD)
    yield signed_in
    signed_in.context.close()


def test_the_workloads_page_and_the_cluster_page_show_the_mesh(
    page: Any, mesh: MeshStack, shots: Shots
) -> None:
    assert mesh.mgmt is not None
    page.goto(mesh.mgmt.url + CLUSTER_UI)
    expect(page.get_by_test_id("trust-domain")).to_contain_text(TRUST_DOMAIN)
    expect(page.get_by_test_id("mesh-namespaces")).to_contain_text("billing")
    expect(page.get_by_test_id("mesh-namespaces")).to_contain_text("shop")
    page.get_by_role("link", name="Workloads").first.click()
    page.wait_for_url(f"**{CLUSTER_UI}/workloads")
    web = page.locator("[data-testid=workload][data-service=web]")
    expect(web).to_contain_text(f"spiffe://{TRUST_DOMAIN}/ns/shop/sa/web")
    expect(web).to_contain_text(re.compile(r"in \d+h"))  # the certificate's expiry
    expect(web).to_contain_text("Applied (ACK)")
    expect(web).to_contain_text("NAMESPACE")
    expect(web).to_contain_text(f"spiffe://{TRUST_DOMAIN}/ns/shop/sa/*")  # who may call
    pay = page.locator("[data-testid=workload][data-service=pay]")
    expect(pay).to_contain_text("anyone: no SecuritySetting selects the namespace")
    shots.take(page, "workloads")

    # Each row links to its sidecar's diagnostics: picked in the list, and the page says
    # plainly when the cluster's agent does not serve them (no agent runs here).
    web.get_by_role("link", name="Diagnostics").click()
    picker = page.get_by_test_id("proxy-picker")
    expect(picker.locator("option:checked")).to_have_text(
        re.compile(r"^sidecar shop/web \(.+\): diagnostics not served$")
    )
    expect(picker.locator("option")).to_have_count(2)
    page.click("button:has-text('Show')")
    expect(page.get_by_test_id("diagnostics-error")).to_contain_text(
        "does not serve the diagnostics of sidecar shop/web"
    )


def test_the_settings_page_shows_the_local_jwt_rules(page: Any, mesh: MeshStack) -> None:
    assert mesh.mgmt is not None
    page.goto(mesh.mgmt.url + f"{GROUP_UI}/settings/s")
    rule = page.get_by_test_id("local-rule")
    expect(rule).to_have_count(1)
    expect(rule).to_contain_text(f"iss={ISSUER}, sub=alice")
    expect(rule).to_contain_text("GET /api/*")
    expect(page.get_by_test_id("local-rules")).to_contain_text("an inline JWKS")
