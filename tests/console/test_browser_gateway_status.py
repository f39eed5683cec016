"""A rate limit's page counts the gateways that carry it: a NACKing gateway shows in red.

Headless Debian Chromium against the gateway stack of :mod:`tests.gateway.nacking`:
mgmt-api, ratelimit and extauthz subscribed to it, and a real gateway Envoy
on ADS that lacks the rate-limit filter. The policy's page lists the ratelimit
instance and the gateway; once the gateway NACKs, the verdict is not green and
the gateway's row is red with Envoy's error.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.console.conftest import fresh_page
from tests.gateway.nacking import POLICY, REFUSED_FILTER, make_it_nack, stack_with_limited_gateway
from tests.mgmt_api.harness import ADMIN_PASSWORD, ok
from tests.support.gateway import CLUSTER, CLUSTER_PATH, ORG, GatewayStack

POLICY_UI = f"/ui/o/{ORG}/c/{CLUSTER}/traffic/{POLICY}"
RED = "rgb(198, 40, 40)"  # --bad in the console's stylesheet

expect.set_options(timeout=60_000)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayStack]:
    with stack_with_limited_gateway(Path(tmp_path_factory.mktemp("console-gateway"))) as st:
        yield st


@pytest.fixture(scope="module")
def page(browser: Any, stack: GatewayStack) -> Iterator[Any]:
    assert stack.mgmt is not None
    signed_in = fresh_page(browser, stack.mgmt.url, "admin", ADMIN_PASSWORD)
    yield signed_in
    signed_in.context.close()


def test_the_policy_page_shows_the_nacking_gateway_in_red(page: Any, stack: GatewayStack) -> None:
    assert stack.mgmt is not None
    entry = make_it_nack(stack)
    # The API lists every instance that carries the policy, the gateway included.
    status = ok(stack.admin.get(f"{CLUSTER_PATH}/backendtrafficpolicies/{POLICY}/status"))
    assert status["reaches"] == ["ratelimit", "gateway"]
    assert [i["kind"] for i in status["instances"]] == ["ratelimit", "gateway"]

    page.goto(stack.mgmt.url + POLICY_UI)
    gateway = page.locator("[data-testid=instance][data-kind=gateway]")
    expect(gateway).to_have_attribute("data-state", "Rejected (NACK)")
    expect(gateway).to_have_class("tone-bad")
    expect(gateway.locator("td.state")).to_have_css("color", RED)
    expect(gateway.locator("td.err")).to_contain_text(REFUSED_FILTER)
    expect(gateway).to_contain_text(entry["appliedVersion"][:12])
    expect(gateway).to_contain_text(entry["desired"][:12])
    ratelimit = page.locator("[data-testid=instance][data-kind=ratelimit]")
    expect(ratelimit).to_have_attribute("data-state", "Applied (ACK)")
    verdict = page.get_by_test_id("verdict")
    expect(verdict).to_have_text("Not applied everywhere: 1 rejected of 2 instances")
    expect(page.get_by_test_id("live-status")).to_have_class("status tone-bad")
