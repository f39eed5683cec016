"""The console in a real browser against a real stack (issue 18's scenarios).

Headless Debian Chromium, mgmt-api, and ratelimit + extauthz subscribed with
the key the console's "Download install template" gives. The tests run in
file order; each starts from the state the previous one left (organization
``web``, cluster ``c1``, rate limit ``default.api-limit``). Every wait is a
condition with a deadline (Playwright's auto-waiting ``expect``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.console.conftest import ConsoleStack, Shots, fresh_page
from tests.mgmt_api.harness import ADMIN_PASSWORD, ok
from tests.support.processes import wait_until

ORG, CLUSTER, POLICY = "web", "c1", "default.api-limit"
CLUSTER_UI = f"/ui/o/{ORG}/c/{CLUSTER}"
POLICY_UI = f"{CLUSTER_UI}/traffic/{POLICY}"
REQUESTS = "spec.rateLimit.global.rules[0].limit.requests"

expect.set_options(timeout=30_000)


@pytest.fixture(scope="module")
def admin_page(browser: Any, stack: ConsoleStack) -> Any:
    page = fresh_page(browser, stack.url, "admin", ADMIN_PASSWORD)
    yield page
    page.context.close()


def _instance(page: Any, kind: str) -> Any:
    return page.locator(f"[data-testid=instance][data-kind={kind}]")


def test_login_create_org_cluster_policy_and_see_every_instance_ack(
    admin_page: Any, stack: ConsoleStack, shots: Shots, tmp_path: Path
) -> None:
    page = admin_page
    expect(page.get_by_test_id("signed-in-as")).to_have_text("users/admin")
    page.fill("#org-name", ORG)
    page.click("text=Create organization")
    page.wait_for_url(f"**/ui/o/{ORG}")
    page.click("text=New cluster")
    page.fill("#c-name", CLUSTER)
    page.click("text=Create cluster")
    expect(page.locator("h1")).to_have_text(f"Cluster {CLUSTER} created")
    # The page never shows the agent's key; the download carries it.
    expect(page.get_by_test_id("install-template")).to_contain_text("<hidden")
    with page.expect_download() as download:
        page.click("button:has-text('Download install template')")
    path = tmp_path / "template.json"
    download.value.save_as(path)
    stack.subscribe(ORG, CLUSTER, json.loads(path.read_text()))

    page.goto(stack.url + CLUSTER_UI)
    page.click("text=New rate limit")
    page.fill("#f-name", POLICY)
    page.fill("[name='spec.targetRef.name']", "api")
    page.fill(f"[name='{REQUESTS}']", "ten")  # the API's message lands beside the field
    page.click("button:has-text('Create')")
    error = page.locator(f"[data-field='{REQUESTS}']")
    expect(error).to_contain_text("integer")
    page.fill(f"[name='{REQUESTS}']", "10")
    page.click("button:has-text('Create')")
    page.wait_for_url(f"**{POLICY_UI}?saved=1")
    expect(page.get_by_test_id("saved")).to_be_visible()
    expect(_instance(page, "ratelimit")).to_have_attribute("data-state", "Applied (ACK)")
    # Route "api" does not exist yet: applied, but amber and saying so.
    expect(page.get_by_test_id("live-status")).to_have_class(re.compile("tone-warn"))
    expect(page.get_by_test_id("verdict")).to_contain_text(
        "Applied with warnings: BackendTrafficPolicy"
    )
    expect(page.get_by_test_id("verdict")).to_contain_text(
        "targets HTTPRoute default/api, which does not exist"
    )
    route = {"rules": [{"backendRefs": [{"name": "api", "port": 80}]}]}
    ok(
        stack.admin.post(
            f"/v2/organizations/{ORG}/clusters/{CLUSTER}/httproutes",
            json={"name": "default.api", "httpRoute": {"spec": route}},
        )
    )
    expect(page.get_by_test_id("verdict")).to_have_text("Applied on all 1 instances")
    shots.take(page, "policy")

    page.goto(stack.url + CLUSTER_UI)
    for kind in ("ratelimit", "extauthz"):
        expect(_instance(page, kind)).to_have_attribute("data-state", "Applied (ACK)")
    expect(page.get_by_test_id("verdict")).to_have_text("Applied on all 2 instances")
    shots.take(page, "cluster")
    page.goto(stack.url + f"/ui/o/{ORG}")
    expect(page.get_by_test_id("clusters")).to_contain_text(CLUSTER)
    shots.take(page, "organization")


def test_a_nack_shows_live_with_the_error_to_fix(admin_page: Any, stack: ConsoleStack) -> None:
    page = admin_page
    page.goto(stack.url + POLICY_UI)
    expect(_instance(page, "ratelimit")).to_have_attribute("data-state", "Applied (ACK)")
    # A cluster switch the ratelimit instance cannot apply (its secret is missing):
    # it NACKs, and the open page shows it without a reload.
    path = f"/v2/organizations/{ORG}/clusters/{CLUSTER}"
    cluster = ok(stack.admin.get(path))
    broken = {"backend": {"redis": {"urlRef": {"name": "missing"}}}}
    ok(stack.admin.put(path, json={"rateLimit": broken, "etag": cluster["etag"]}))
    row = _instance(page, "ratelimit")
    expect(row).to_have_attribute("data-state", "Rejected (NACK)")
    expect(row.locator("td.err")).to_contain_text("secret default/missing")
    expect(page.get_by_test_id("verdict")).to_contain_text("1 rejected")
    cluster = ok(stack.admin.get(path))
    ok(stack.admin.put(path, json={"etag": cluster["etag"]}))
    expect(row).to_have_attribute("data-state", "Applied (ACK)")


def test_an_etag_conflict_from_a_second_session_offers_a_diff(
    admin_page: Any, browser: Any, stack: ConsoleStack, shots: Shots
) -> None:
    first = admin_page
    second = fresh_page(browser, stack.url, "admin", ADMIN_PASSWORD)
    try:
        first.goto(stack.url + POLICY_UI)
        second.goto(stack.url + POLICY_UI)
        first.fill(f"[name='{REQUESTS}']", "20")
        first.click("button:has-text('Save')")
        expect(first.get_by_test_id("saved")).to_be_visible()
        second.fill(f"[name='{REQUESTS}']", "30")
        second.click("button:has-text('Save')")
        conflict = second.get_by_test_id("conflict")
        expect(conflict).to_be_visible()
        expect(conflict.locator(".d-del")).to_contain_text("requests: 20")
        expect(conflict.locator(".d-add")).to_contain_text("requests: 30")
        shots.take(second, "conflict")
        assert (
            ok(stack.admin.get(_api_policy()))["spec"]["rateLimit"]["global"]["rules"][0]["limit"][
                "requests"
            ]
            == 20
        )  # nothing was overwritten
        second.get_by_test_id("reload").click()
        expect(second.locator(f"[name='{REQUESTS}']")).to_have_value("20")
    finally:
        second.context.close()


def _api_policy() -> str:
    return f"/v2/organizations/{ORG}/clusters/{CLUSTER}/backendtrafficpolicies/{POLICY}"


def test_an_approval_flow(admin_page: Any, stack: ConsoleStack, shots: Shots) -> None:
    page = admin_page
    page.goto(stack.url + f"/ui/o/{ORG}/approvals")
    page.select_option("#mode", "REQUIRE_APPROVAL")
    page.click("text=Save mode")
    expect(page.get_by_test_id("mode")).to_have_text("REQUIRE_APPROVAL")
    for subject in ("apps/shop", "apps/intruder"):
        page.fill("#rq-subject", subject)
        page.fill("#rq-perms", "READ, WRITE")
        page.get_by_role("button", name="Request", exact=True).click()
        expect(
            page.locator(f"[data-testid=requested] tr[data-subject='{subject}']")
        ).to_be_visible()
    shots.take(page, "approvals")
    shop = page.locator("[data-testid=requested] tr[data-subject='apps/shop']")
    shop.locator("input[name=permissions]").fill("READ")  # approve with changed permissions
    shop.locator("button:has-text('Approve')").click()
    approved = page.locator("[data-testid=approved] tr[data-subject='apps/shop']")
    expect(approved).to_contain_text("READ")
    expect(approved).not_to_contain_text("WRITE")
    page.locator(
        "[data-testid=requested] tr[data-subject='apps/intruder'] button:has-text('Delete request')"
    ).click()
    expect(page.locator("[data-testid=requested] tr[data-subject='apps/intruder']")).to_have_count(
        0
    )
    approved.locator("button:has-text('Revoke')").click()
    expect(page.locator("[data-testid=approved] tr[data-subject='apps/shop']")).to_have_count(0)
    policy = ok(stack.admin.get(f"/v2/organizations/{ORG}/approvals"))
    assert not policy.get("requested") and not policy.get("approved")


def test_a_reader_sees_no_write_action_and_forged_posts_are_refused(
    browser: Any, stack: ConsoleStack
) -> None:
    login, password = stack.user(ORG, "viewer", "rbac/reader")
    page = fresh_page(browser, stack.url, login, password)
    try:
        page.goto(stack.url + f"/ui/o/{ORG}")
        expect(page.get_by_test_id("clusters")).to_contain_text(CLUSTER)
        expect(page.locator("text=New cluster")).to_have_count(0)
        page.goto(stack.url + POLICY_UI)
        expect(page.get_by_test_id("read-only")).to_be_visible()
        expect(page.locator("button:has-text('Save')")).to_have_count(0)
        expect(page.locator("button:has-text('Delete')")).to_have_count(0)
        page.goto(stack.url + CLUSTER_UI)
        expect(page.locator("text=Delete cluster")).to_have_count(0)
        # A POST without this session's CSRF token: refused before anything runs.
        forged = page.request.post(
            stack.url + POLICY_UI + "/delete", form={"x": "1"}, max_redirects=0
        )
        assert forged.status == 403
        assert "security token" in forged.text()
        # With the token the reader holds, the API's RBAC refuses, and says what is missing.
        token = page.locator("meta[name=csrf-token]").get_attribute("content")
        denied = page.request.post(
            stack.url + POLICY_UI + "/delete", form={"_csrf": token}, max_redirects=0
        )
        assert denied.status == 403
        assert re.search(r"missing permission DELETE", denied.text())
        assert "Traceback" not in denied.text()
        assert ok(stack.admin.get(_api_policy()))  # still there
    finally:
        page.context.close()


def test_lost_connection_and_expired_session_say_so_and_recover(
    browser: Any, stack: ConsoleStack
) -> None:
    page = fresh_page(browser, stack.url, "admin", ADMIN_PASSWORD)
    try:
        page.goto(stack.url + POLICY_UI)
        expect(_instance(page, "ratelimit")).to_be_visible()
        page.context.set_offline(True)
        expect(page.locator("#banner")).to_contain_text("Lost the connection")
        page.context.set_offline(False)
        expect(page.locator("#banner")).to_contain_text("Connection restored")
        page.context.clear_cookies()  # as if the session had expired
        banner = page.locator("#banner")
        expect(banner).to_contain_text("Your session expired")
        banner.locator("a").click()
        expect(page.locator(".notice")).to_contain_text("Your session expired")
        page.fill("#login", "admin")
        page.fill("#password", ADMIN_PASSWORD)
        page.click("form[action='/ui/login'] button[type=submit]")
        page.wait_for_url(f"**{POLICY_UI}")  # back where the user was
    finally:
        page.context.close()


def test_audit_log_filters_and_dashboard_download(
    admin_page: Any, stack: ConsoleStack, shots: Shots, tmp_path: Path
) -> None:
    page = admin_page
    page.goto(stack.url + f"/ui/o/{ORG}/audit")
    page.fill("#a-kind", "BackendTrafficPolicy")
    page.fill("#a-op", "UPDATE")
    page.click("text=Filter")
    rows = page.locator("[data-testid=audit] tbody tr")
    expect(rows.first).to_contain_text("BackendTrafficPolicy")
    for text in rows.all_inner_texts():
        assert "UPDATE" in text and "BackendTrafficPolicy" in text
    shots.take(page, "audit")
    page.goto(stack.url + "/ui/dashboards")
    with page.expect_download() as download:
        page.locator("[data-testid=dashboards] a").first.click()
    saved = tmp_path / "dashboard.json"
    download.value.save_as(saved)
    assert "panels" in json.loads(saved.read_text())


def test_every_page_sends_a_strict_csp_and_the_cookie_is_locked_down(
    admin_page: Any, stack: ConsoleStack
) -> None:
    page = admin_page
    response = page.goto(stack.url + CLUSTER_UI)
    assert response is not None
    csp = response.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp and "unsafe-eval" not in csp
    assert response.headers["x-frame-options"] == "DENY"
    (cookie,) = [c for c in page.context.cookies() if c["name"] == "meshplane-console"]
    assert cookie["httpOnly"] and cookie["sameSite"] == "Lax" and cookie["path"] == "/ui/"
    # Loopback HTTP: not Secure (scripts/run); anywhere else it is (test_console_units).
    assert cookie["secure"] is False
    assert page.evaluate("document.cookie") == ""  # no script can read the session
    wrong = page.context.new_page()
    try:
        wrong.goto(stack.url + "/ui/login")
        wrong.fill("#login", "admin")
        wrong.fill("#password", "not-the-password")
        wrong.click("form[action='/ui/login'] button[type=submit]")
        expect(wrong.locator(".error")).to_contain_text("Wrong login or password")
    finally:
        wrong.close()


def test_the_audit_log_fits_a_1400_pixel_window(browser: Any, stack: ConsoleStack) -> None:
    """Long FQNs and messages wrap inside the table instead of widening the page."""
    long_name = "a-" + "x" * 60
    ok(stack.admin.post(f"/v2/organizations/{ORG}/tenants", json={"name": long_name, "tenant": {}}))
    page = fresh_page(browser, stack.url, "admin", ADMIN_PASSWORD)
    try:
        page.set_viewport_size({"width": 1400, "height": 900})
        page.goto(stack.url + f"/ui/o/{ORG}/audit")
        expect(page.get_by_test_id("audit")).to_contain_text(long_name[:20])
        overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        assert overflow <= 0, overflow
    finally:
        page.context.close()


def test_the_cluster_page_lists_routes_and_backends_and_pages_carry_a_favicon(
    admin_page: Any, stack: ConsoleStack
) -> None:
    base = f"/v2/organizations/{ORG}/clusters/{CLUSTER}"
    ref = {"group": "gateway.envoyproxy.io", "kind": "Backend", "name": "api"}
    rule = {"matches": [{"path": {"type": "PathPrefix", "value": "/api"}}], "backendRefs": [ref]}
    route = {"name": "default.api", "httpRoute": {"spec": {"rules": [rule]}}}
    endpoint = {"ip": {"address": "10.0.0.7", "port": 8080}}
    backend = {"name": "default.api", "backend": {"spec": {"endpoints": [endpoint]}}}
    ok(stack.admin.post(f"{base}/backends", json=backend))
    # The first test created route default.api (its rate limit's target) without a backend.
    stack.admin.delete(f"{base}/httproutes/default.api")
    ok(stack.admin.post(f"{base}/httproutes", json=route))
    page = admin_page
    page.goto(stack.url + CLUSTER_UI)
    expect(page.get_by_test_id("routes")).to_contain_text("default.api")
    expect(page.get_by_test_id("routes")).to_contain_text("/api/* → api")
    expect(page.get_by_test_id("backends")).to_contain_text("10.0.0.7:8080")
    icon = page.locator("link[rel=icon]").get_attribute("href")
    assert icon is not None
    answer = page.request.get(stack.url + icon)
    assert answer.status == 200 and answer.headers["content-type"].startswith("image/svg+xml")


def test_breadcrumbs_walk_every_level_down_to_a_policy(
    admin_page: Any, stack: ConsoleStack
) -> None:
    org = f"/v2/organizations/{ORG}"
    ok(stack.admin.post(f"{org}/tenants", json={"name": "t1", "tenant": {}}))
    workspace = {"namespaceSelector": {"names": [f"{CLUSTER}/*"]}}
    ok(
        stack.admin.post(
            f"{org}/tenants/t1/workspaces", json={"name": "w1", "workspace": workspace}
        )
    )
    group = {"configMode": "BRIDGED"}
    path = f"{org}/tenants/t1/workspaces/w1/securitygroups"
    ok(stack.admin.post(path, json={"name": "g1", "securityGroup": group}))
    page = admin_page
    page.goto(stack.url + f"/ui/o/{ORG}/t/t1/w/w1/g/g1")
    crumbs = page.locator("nav.crumbs")
    expect(crumbs).to_have_text(re.compile(r"tenant t1 / workspace w1 / security group g1\s*$"))
    expect(page.locator("h2", has_text="JWT policies")).to_be_visible()
    page.goto(stack.url + f"/ui/o/{ORG}/t/t1/w/w1/g/g1/jwt/new")
    expect(crumbs).to_have_text(
        re.compile(r"tenant t1 / workspace w1 / security group g1 / new\s*$")
    )
    expect(crumbs.get_by_role("link", name="workspace w1")).to_have_attribute(
        "href", f"/ui/o/{ORG}/t/t1/w/w1"
    )


def test_diagnostics_page_reads_a_real_proxy_and_sets_levels_with_the_users_rights(
    admin_page: Any, browser: Any, stack: ConsoleStack, shots: Shots
) -> None:
    stack.proxy_with_agent(ORG, CLUSTER)
    cluster_api = f"/v2/organizations/{ORG}/clusters/{CLUSTER}"
    wait_until(
        lambda: "web-1" in json.dumps(ok(stack.admin.get(f"{cluster_api}?fetchWorkloads=true"))),
        60,
        "the agent's inventory to list its proxy",
    )
    page = admin_page
    page.goto(stack.url + CLUSTER_UI)
    page.get_by_role("link", name="Diagnostics").click()
    page.wait_for_url(f"**{CLUSTER_UI}/diagnostics")
    # A list of the known proxies, not a blank field.
    picker = page.get_by_test_id("proxy-picker")
    expect(picker.locator("option")).to_have_text(["proxy shop/web (web-1)"])
    page.fill("#d-filter", "^server\\.live$")
    page.click("button:has-text('Show')")
    answer = page.get_by_test_id("diagnostics-answer")
    expect(answer.locator("tbody tr")).to_have_text([re.compile(r"server\.live\s*1")])
    page.select_option("#d-view", "clusters")
    page.click("button:has-text('Show')")
    expect(answer.locator("thead")).to_contain_text("Endpoint")
    page.select_option("#d-view", "config")
    page.fill("#d-res", "dynamic_active_clusters")
    page.click("button:has-text('Show')")
    # Each view's answer has its own shape: wait for it, not for something the last one had.
    expect(answer).to_contain_text("The proxy has no configuration of that kind.")
    page.fill("#d-res", "")
    page.click("button:has-text('Show')")
    expect(answer.locator("summary").first).to_have_text("BootstrapConfigDump")
    page.select_option("#d-view", "loggers")
    page.click("button:has-text('Show')")
    expect(answer.locator("thead")).to_contain_text("Logger")
    expect(answer).to_contain_text("upstream")
    page.fill("#d-logger", "upstream")
    page.select_option("#d-level", "debug")
    page.get_by_test_id("set-levels").locator("button").click()
    expect(answer.locator("tr", has_text="upstream").first).to_contain_text("debug")
    shots.take(page, "diagnostics")
    # A reader sees the answers but no write form; the API refuses a forged write.
    login, password = stack.user(ORG, "diag-reader", "rbac/reader")
    reader = fresh_page(browser, stack.url, login, password)
    try:
        reader.goto(stack.url + f"{CLUSTER_UI}/diagnostics?view=loggers&proxy=proxy:shop/web/web-1")
        expect(reader.get_by_test_id("diagnostics-answer")).to_contain_text("upstream")
        expect(reader.get_by_test_id("set-levels")).to_have_count(0)
        token = reader.locator("meta[name=csrf-token]").get_attribute("content")
        forged = reader.request.post(
            stack.url + f"{CLUSTER_UI}/diagnostics/loggers",
            form={"_csrf": token or "", "namespace": "shop", "workload": "web", "level": "trace"},
            max_redirects=0,
        )
        assert forged.status == 403, forged.text()
        assert re.search(r"missing permission WRITE", forged.text())
    finally:
        reader.context.close()


def test_an_editor_cannot_mint_an_agent_key_through_the_console(
    browser: Any, stack: ConsoleStack
) -> None:
    """The console's one access-granting action (the install template mints an agent
    key) goes through the API's rule: SET_POLICY on the organization (docs/api.md)."""
    login, password = stack.user(ORG, "keen-editor", "rbac/editor")
    agent = f"/v2/organizations/{ORG}/clusters/{CLUSTER}/serviceaccounts/agent"
    keys = ok(stack.admin.get(agent))["keys"]
    page = fresh_page(browser, stack.url, login, password)
    try:
        page.goto(stack.url + CLUSTER_UI)
        token = page.locator("meta[name=csrf-token]").get_attribute("content")
        denied = page.request.post(
            stack.url + CLUSTER_UI + "/install-template", form={"_csrf": token}, max_redirects=0
        )
        assert denied.status == 403
        assert re.search(r"missing permission SET_POLICY", denied.text())
        assert ok(stack.admin.get(agent))["keys"] == keys
    finally:
        page.context.close()
