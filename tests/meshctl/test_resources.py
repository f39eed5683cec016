"""get / apply / delete / edit against the real management plane, checked over plain HTTP."""

from __future__ import annotations

import json
import stat
import textwrap
from pathlib import Path

import yaml

from tests.meshctl.conftest import ManagementPlane, Meshctl, as_json, unique


def tree(org: str) -> str:
    return textwrap.dedent(
        f"""\
        apiVersion: meshplane.io/v2
        kind: Organization
        metadata: {{name: {org}}}
        spec: {{displayName: Org {org}}}
        ---
        kind: Tenant
        metadata: {{name: t1, organization: {org}}}
        spec: {{displayName: Tenant one}}
        ---
        kind: Workspace
        metadata: {{name: w1, organization: {org}, tenant: t1}}
        spec:
          namespaceSelector: {{names: ["*/payments"]}}
        ---
        kind: Cluster
        metadata: {{name: c1, organization: {org}}}
        spec:
          network: vpc-1
          labels: {{env: prod}}
        ---
        kind: Cluster
        metadata: {{fqn: organizations/{org}/clusters/c2}}
        spec:
          labels: {{env: dev}}
        ---
        kind: AccessPolicy
        metadata: {{target: organizations/{org}/tenants/t1}}
        spec:
          allow:
          - role: rbac/reader
            subjects: [{{user: users/admin}}]
        """
    )


def test_apply_creates_then_reports_unchanged_then_updates(
    shared_admin: Meshctl, mgmt: ManagementPlane, tmp_path: Path
) -> None:
    org = unique("apply")
    manifest = tmp_path / "tree.yaml"
    manifest.write_text(tree(org))
    out = shared_admin.ok("apply", "-f", str(manifest))
    assert out.splitlines() == [
        f"Organization organizations/{org} created",
        f"Tenant organizations/{org}/tenants/t1 created",
        f"Workspace organizations/{org}/tenants/t1/workspaces/w1 created",
        f"Cluster organizations/{org}/clusters/c1 created (get its install template with "
        f"meshctl clusters install-template {org} c1)",
        f"Cluster organizations/{org}/clusters/c2 created (get its install template with "
        f"meshctl clusters install-template {org} c2)",
        f"AccessPolicy organizations/{org}/tenants/t1 configured",
    ]
    with mgmt.admin() as http:
        cluster = as_json(http.get(f"/v2/organizations/{org}/clusters/c1"))
        assert cluster["network"] == "vpc-1" and cluster["labels"] == {"env": "prod"}
        policy = as_json(http.get(f"/v2/organizations/{org}/tenants/t1/policy"))
        assert {"role": "rbac/reader", "subjects": [{"user": "users/admin"}]} in policy["allow"]
        etag_before = cluster["etag"]

    # Idempotent: nothing is written the second time (the etag does not move).
    again = shared_admin.ok("apply", "-f", str(manifest))
    assert all(line.endswith(" unchanged") for line in again.splitlines()), again
    with mgmt.admin() as http:
        assert as_json(http.get(f"/v2/organizations/{org}/clusters/c1"))["etag"] == etag_before

    # A changed field is a PUT with the current etag.
    manifest.write_text(tree(org).replace("vpc-1", "vpc-2"))
    changed = shared_admin.ok("apply", "-f", str(manifest))
    assert f"Cluster organizations/{org}/clusters/c1 configured" in changed
    with mgmt.admin() as http:
        cluster = as_json(http.get(f"/v2/organizations/{org}/clusters/c1"))
    assert cluster["network"] == "vpc-2" and cluster["etag"] != etag_before


def test_get_lists_and_shows_in_table_yaml_and_json(shared_admin: Meshctl, tmp_path: Path) -> None:
    org = unique("get")
    shared_admin.ok("apply", "-f", "-", input=tree(org))

    table = shared_admin.ok("get", "clusters", "--org", org)
    header, *rows = table.splitlines()
    assert header.split() == ["NAME", "PARENT", "DISPLAY", "NAME", "AGE"]
    assert [r.split()[:2] for r in rows] == [
        ["c1", f"organizations/{org}"],
        ["c2", f"organizations/{org}"],
    ]

    # Paging: every page is fetched, following nextPageToken.
    paged = shared_admin.run("-v", "get", "clusters", "--org", org, "--chunk-size", "1")
    assert paged.returncode == 0, paged.stderr
    assert [r.split()[0] for r in paged.stdout.splitlines()[1:]] == ["c1", "c2"]
    requests = [line for line in paged.stderr.splitlines() if line.startswith("> GET")]
    assert len(requests) in {2, 3} and "pageToken=" in requests[1]
    limited = shared_admin.ok("get", "clusters", "--org", org, "--limit", "1")
    assert [r.split()[0] for r in limited.splitlines()[1:]] == ["c1"]

    listing = json.loads(
        shared_admin.ok("get", "clusters", "--org", org, "-o", "json", "-l", "env=prod")
    )
    assert listing["kind"] == "List"
    assert [i["metadata"]["name"] for i in listing["items"]] == ["c1"]

    docs = list(
        yaml.safe_load_all(
            shared_admin.ok("get", f"organizations/{org}/tenants/t1/workspaces/w1", "-o", "yaml")
        )
    )
    assert len(docs) == 1
    ws = docs[0]
    assert ws["kind"] == "Workspace"
    assert ws["metadata"]["name"] == "w1" and ws["metadata"]["tenant"] == "t1"
    assert ws["metadata"]["organization"] == org and ws["metadata"]["etag"]
    assert ws["spec"]["namespaceSelector"] == {"names": ["*/payments"]}

    # The profile's default organization replaces --org.
    shared_admin.ok("config", "set-profile", "default", "--org", org)
    try:
        single = yaml.safe_load(shared_admin.ok("get", "cluster", "c2", "-o", "yaml"))
        assert single["metadata"]["fqn"] == f"organizations/{org}/clusters/c2"
        assert single["status"]["namespaces"] == []  # agent-owned fields live under status
    finally:
        shared_admin.ok("config", "set-profile", "default", "--org", "")

    # What get prints is what apply takes back (with its etag, so it is a real PUT).
    exported = tmp_path / "ws.yaml"
    exported.write_text(yaml.safe_dump(ws).replace("*/payments", "*/billing"))
    assert "configured" in shared_admin.ok("apply", "-f", str(exported))


def test_a_stale_etag_is_a_conflict_exit_5_and_changes_nothing(
    shared_admin: Meshctl, mgmt: ManagementPlane, tmp_path: Path
) -> None:
    org = unique("etag")
    shared_admin.ok("apply", "-f", "-", input=tree(org))
    exported = shared_admin.ok("get", "cluster", "c1", "--org", org, "-o", "yaml")
    # Someone else changes the cluster after we read it.
    with mgmt.admin() as http:
        current = as_json(http.get(f"/v2/organizations/{org}/clusters/c1"))
        as_json(http.put(f"/v2/organizations/{org}/clusters/c1",
                         json={**current, "network": "theirs"}))  # fmt: skip
    mine = tmp_path / "mine.yaml"
    mine.write_text(exported.replace("vpc-1", "mine"))
    line = shared_admin.fails(5, "apply", "-f", str(mine))
    assert line.startswith("error: ABORTED (409): ")
    assert f"meshctl get cluster organizations/{org}/clusters/c1" in line
    with mgmt.admin() as http:
        assert as_json(http.get(f"/v2/organizations/{org}/clusters/c1"))["network"] == "theirs"


def test_creating_an_existing_object_with_its_old_etag_after_delete_is_a_conflict(
    shared_admin: Meshctl,
) -> None:
    org = unique("gone")
    shared_admin.ok("apply", "-f", "-", input=f"kind: Organization\nmetadata: {{name: {org}}}\n")
    exported = shared_admin.ok("get", "org", org, "-o", "yaml")
    shared_admin.ok("delete", "org", org, "--yes")
    line = shared_admin.fails(5, "apply", "-f", "-", input=exported)
    assert "does not exist" in line and "metadata.etag" in line


def test_an_invalid_manifest_exits_2_before_any_write(
    shared_admin: Meshctl, mgmt: ManagementPlane
) -> None:
    org = unique("invalid")
    text = (
        f"kind: Organization\nmetadata: {{name: {org}}}\n---\nkind: Tenant\nmetadata: {{name: t}}\n"
    )
    line = shared_admin.fails(2, "apply", "-f", "-", input=text)
    assert "#2" in line and "a Tenant lives under a parent" in line
    with mgmt.admin() as http:
        assert http.get(f"/v2/organizations/{org}").status_code == 404
    assert "not valid YAML" in shared_admin.fails(2, "apply", "-f", "-", input="kind: [\n")
    assert "unknown top-level field 'sepc'" in shared_admin.fails(
        2, "apply", "-f", "-", input="kind: Organization\nmetadata: {name: x}\nsepc: {}\n"
    )


def test_server_validation_errors_exit_1_naming_the_field(shared_admin: Meshctl) -> None:
    org = unique("valid")
    shared_admin.ok("apply", "-f", "-", input=f"kind: Organization\nmetadata: {{name: {org}}}\n")
    line = shared_admin.fails(
        1, "apply", "-f", "-",
        input=f"kind: Cluster\nmetadata: {{name: c, organization: {org}}}\n"
        "spec: {tokenTtl: soon}\n",
    )  # fmt: skip
    assert line.startswith("error: INVALID_ARGUMENT (400): cluster.tokenTtl")


def test_delete_refuses_protected_trees_without_force_and_get_then_exits_4(
    shared_admin: Meshctl, mgmt: ManagementPlane
) -> None:
    org = unique("del")
    shared_admin.ok(
        "apply", "-f", "-",
        input=f"kind: Organization\nmetadata: {{name: {org}}}\n---\nkind: Tenant\n"
        f"metadata: {{name: locked, organization: {org}}}\n"
        "spec: {deletionProtectionEnabled: true}\n",
    )  # fmt: skip
    line = shared_admin.fails(1, "delete", "organization", org, "--yes")
    assert "FAILED_PRECONDITION (400)" in line
    assert f"deletionProtectionEnabled: false on organizations/{org}/tenants/locked" in line
    assert "--force" in line
    assert shared_admin.ok("delete", "organization", org, "--force", "--yes").strip() == (
        f"Organization organizations/{org} deleted"
    )
    line = shared_admin.fails(4, "get", "tenant", "locked", "--org", org)
    assert line.startswith("error: NOT_FOUND (404): ") and "meshctl get tenants --org" in line
    with mgmt.admin() as http:
        assert http.get(f"/v2/organizations/{org}").status_code == 404


def test_delete_by_file(shared_admin: Meshctl, mgmt: ManagementPlane, tmp_path: Path) -> None:
    org = unique("delf")
    manifest = tmp_path / "t.yaml"
    manifest.write_text(tree(org))
    shared_admin.ok("apply", "-f", str(manifest))
    only_clusters = "\n---\n".join(
        d for d in manifest.read_text().split("---\n") if "kind: Cluster" in d
    )
    out = shared_admin.ok("delete", "-f", "-", "--yes", input=only_clusters)
    assert out.count(" deleted") == 2
    with mgmt.admin() as http:
        assert as_json(http.get(f"/v2/organizations/{org}/clusters"))["clusters"] == []


def test_delete_by_the_apply_manifest_undoes_it(
    shared_admin: Meshctl, mgmt: ManagementPlane, tmp_path: Path
) -> None:
    """The manifest ``apply -f`` created from deletes in reverse dependency order:
    workspace before tenant, clusters before their organization, exit 0."""
    org = unique("undo")
    manifest = tmp_path / "tree.yaml"
    manifest.write_text(tree(org).split("---\nkind: AccessPolicy")[0])
    shared_admin.ok("apply", "-f", str(manifest))
    out = shared_admin.ok("delete", "-f", str(manifest), "--yes")
    order = [line.split(" ", 2)[1] for line in out.splitlines()]
    assert order.index(f"organizations/{org}/tenants/t1/workspaces/w1") < order.index(
        f"organizations/{org}/tenants/t1"
    )
    assert order[-1] == f"organizations/{org}"
    assert out.count(" deleted") == 5
    with mgmt.admin() as http:
        assert http.get(f"/v2/organizations/{org}").status_code == 404
    # Run again: what is gone under a listed parent is not an error; the
    # organization itself (listed, nothing above it) is.
    again = shared_admin.run("delete", "-f", str(manifest), "--yes")
    assert again.returncode == 4, again.stderr
    assert again.stdout.count("already gone") == 4, again.stdout
    assert "NOT_FOUND" in again.stderr


def test_delete_by_file_undoes_an_applied_user_and_access_policy(
    shared_admin: Meshctl, mgmt: ManagementPlane, tmp_path: Path
) -> None:
    """A file ``apply -f`` accepted (a User and an AccessPolicy) is undone by ``delete -f``:
    the user is deleted, the policy emptied (policies always exist), exit 0."""
    org = unique("undo-pol")
    shared_admin.ok("apply", "-f", "-", input=f"kind: Organization\nmetadata: {{name: {org}}}\n")
    manifest = tmp_path / "user.yaml"
    manifest.write_text(
        textwrap.dedent(
            f"""\
            kind: User
            metadata: {{name: ann, organization: {org}}}
            spec: {{email: ann@example.test}}
            ---
            kind: AccessPolicy
            metadata: {{target: organizations/{org}}}
            spec:
              allow:
              - role: rbac/reader
                subjects: [{{user: users/admin}}]
            """
        )
    )
    assert shared_admin.ok("apply", "-f", str(manifest)).splitlines() == [
        f"User organizations/{org}/users/ann created",
        f"AccessPolicy organizations/{org} configured",
    ]
    assert shared_admin.ok("delete", "-f", str(manifest)).splitlines() == [
        f"User organizations/{org}/users/ann deleted",
        f"AccessPolicy organizations/{org} emptied",
    ]
    with mgmt.admin() as http:
        assert http.get(f"/v2/organizations/{org}/users/ann").status_code == 404
        assert as_json(http.get(f"/v2/organizations/{org}/policy"))["allow"] == []


def test_kind_words_match_case_insensitively_and_by_alias_everywhere(
    shared_admin: Meshctl, mgmt: ManagementPlane
) -> None:
    org = unique("words")
    shared_admin.ok("apply", "-f", "-", input=f"kind: organization\nmetadata: {{name: {org}}}\n")
    shared_admin.ok(
        "apply", "-f", "-",
        input=f"kind: accesspolicy\nmetadata: {{target: organizations/{org}}}\n"
        "spec: {allow: [{role: rbac/reader, subjects: [{user: users/admin}]}]}\n",
    )  # fmt: skip
    assert "rbac/reader" in shared_admin.ok("get", "AccessPolicy", f"organizations/{org}")
    assert shared_admin.ok("delete", "accesspolicy", f"organizations/{org}").strip() == (
        f"AccessPolicy organizations/{org} emptied"
    )
    with mgmt.admin() as http:
        assert as_json(http.get(f"/v2/organizations/{org}/policy"))["allow"] == []
    shared_admin.ok(
        "apply", "-f", "-", input=f"kind: TN\nmetadata: {{name: t, organization: {org}}}\n"
    )
    assert shared_admin.ok("delete", "TENANTS", "t", "--org", org).strip() == (
        f"Tenant organizations/{org}/tenants/t deleted"
    )


EDITOR_SCRIPT = textwrap.dedent(
    """\
    import os, pathlib, sys
    path = pathlib.Path(sys.argv[1])
    text = path.read_text()
    assert "etag" in text, text
    if os.environ.get("RACE_URL"):  # someone else writes while the editor is open
        import httpx
        url = os.environ["RACE_URL"]
        auth = ("admin", os.environ["RACE_PASSWORD"])
        current = httpx.get(url, auth=auth).json()
        httpx.put(url, auth=auth, json={**current, "displayName": "theirs"}).raise_for_status()
    path.write_text(text.replace("Tenant one", os.environ["NEW_NAME"]))
    """
)


def test_edit_updates_with_the_etag_it_read_and_detects_races(
    shared_admin: Meshctl, mgmt: ManagementPlane, tmp_path: Path
) -> None:
    import sys

    from tests.meshctl.conftest import ADMIN_PASSWORD

    org = unique("edit")
    shared_admin.ok("apply", "-f", "-", input=tree(org))
    script = tmp_path / "editor.py"
    script.write_text(EDITOR_SCRIPT)
    editor = f"{sys.executable} {script}"

    out = shared_admin.ok(
        "edit", "tenant", "t1", "--org", org, env={"EDITOR": editor, "NEW_NAME": "Renamed"}
    )
    assert out.strip() == f"Tenant organizations/{org}/tenants/t1 edited"
    with mgmt.admin() as http:
        assert as_json(http.get(f"/v2/organizations/{org}/tenants/t1"))["displayName"] == "Renamed"

    # Saving the file unchanged writes nothing.
    unchanged = shared_admin.ok("edit", "tenant", "t1", "--org", org, env={"EDITOR": "true"})
    assert "no changes made" in unchanged

    # A concurrent write during the edit: refused, theirs kept.
    shared_admin.ok("apply", "-f", "-", input=tree(org))  # displayName back to "Tenant one"
    line = shared_admin.fails(
        5, "edit", f"organizations/{org}/tenants/t1",
        env={
            "EDITOR": editor,
            "NEW_NAME": "Mine",
            "RACE_URL": f"{mgmt.url}/v2/organizations/{org}/tenants/t1",
            "RACE_PASSWORD": ADMIN_PASSWORD,
        },
    )  # fmt: skip
    assert line.startswith("error: ABORTED (409): ")
    with mgmt.admin() as http:
        assert as_json(http.get(f"/v2/organizations/{org}/tenants/t1"))["displayName"] == "theirs"
    # The user's edit is not lost: it is kept in a private file named in the error.
    kept = Path(line.split("your edited copy is in ")[1].split(" ")[0])
    assert "displayName: Mine" in kept.read_text()
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    kept.unlink()


def test_install_template_to_stdout_and_to_a_private_file(
    shared_admin: Meshctl, tmp_path: Path
) -> None:
    org = unique("tpl")
    shared_admin.ok("apply", "-f", "-", input=tree(org))
    template = json.loads(shared_admin.ok("clusters", "install-template", org, "c1", "-o", "json"))
    account = template["helm"]["secrets"]["clusterServiceAccount"]
    assert account["clusterFqn"] == f"organizations/{org}/clusters/c1"
    assert json.loads(account["jwk"])["d"]  # the private key (API key) is in it

    target = tmp_path / "values.yaml"
    result = shared_admin.run("clusters", "install-template", org, "c1", "--file", str(target))
    assert result.returncode == 0 and result.stdout == ""
    assert "keep it secret" in result.stderr
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    written = yaml.safe_load(target.read_text())
    fresh_key = written["helm"]["secrets"]["clusterServiceAccount"]["keyId"]
    assert fresh_key != account["keyId"]  # every fetch mints a new key pair

    line = shared_admin.fails(4, "clusters", "install-template", org, "nope")
    assert "NOT_FOUND (404)" in line


def test_policy_kinds_under_security_groups_and_clusters(
    shared_admin: Meshctl, mgmt: ManagementPlane
) -> None:
    org = unique("kinds")
    where = f"organization: {org}, tenant: t, workspace: w"
    text = textwrap.dedent(
        f"""\
        kind: Organization
        metadata: {{name: {org}}}
        ---
        kind: Tenant
        metadata: {{name: t, organization: {org}}}
        ---
        kind: Workspace
        metadata: {{name: w, {where}}}
        spec: {{namespaceSelector: {{names: ["*/ns"]}}}}
        ---
        kind: SecurityGroup
        metadata: {{name: g, {where}}}
        spec: {{namespaceSelector: {{names: ["*/ns"]}}, configMode: BRIDGED}}
        ---
        kind: SecuritySetting
        metadata: {{name: s, {where}, securityGroup: g}}
        spec:
          authorization: {{mode: CLUSTER, http: {{external: {{uri: "grpc://extauthz:9000"}}}}}}
        ---
        kind: Cluster
        metadata: {{name: c, organization: {org}}}
        ---
        kind: BackendTrafficPolicy
        metadata: {{name: default.rl, organization: {org}, cluster: c}}
        spec:
          spec:
            targetRef: {{group: gateway.networking.k8s.io, kind: HTTPRoute, name: r}}
            rateLimit:
              type: Global
              global: {{rules: [{{limit: {{requests: 10, unit: Second}}}}]}}
        """
    )
    out = shared_admin.ok("apply", "-f", "-", input=text)
    assert out.count(" created") == 7, out
    group = ["--org", org, "--tenant", "t", "--workspace", "w", "--security-group", "g"]
    setting = yaml.safe_load(shared_admin.ok("get", "setting", "s", *group, "-o", "yaml"))
    assert setting["spec"]["authorization"]["http"]["external"]["uri"] == "grpc://extauthz:9000"
    base = f"/v2/organizations/{org}/clusters/c/backendtrafficpolicies/default.rl"
    with mgmt.admin() as http:
        stored = as_json(http.get(base))
    assert stored["spec"]["rateLimit"]["global"]["rules"] == [
        {"limit": {"requests": 10, "unit": "Second"}}
    ]
    assert "default.rl" in shared_admin.ok("get", "btp", "--org", org, "--cluster", "c")


def test_apply_get_and_delete_profiles_and_onboarding_configs(
    shared_admin: Meshctl, mgmt: ManagementPlane, tmp_path: Path
) -> None:
    """The two kinds meshctl once lacked, end to end against the server."""
    org = unique("kinds")
    manifest = tmp_path / "kinds.yaml"
    manifest.write_text(
        textwrap.dedent(
            f"""\
            kind: Organization
            metadata: {{name: {org}}}
            spec: {{}}
            ---
            kind: Tenant
            metadata: {{name: t1, organization: {org}}}
            spec: {{}}
            ---
            kind: Profile
            metadata: {{name: strict, organization: {org}, tenant: t1}}
            spec:
              mandates: {{traffic: {{timeout: 5s}}}}
            ---
            kind: Cluster
            metadata: {{name: c1, organization: {org}}}
            spec: {{}}
            ---
            kind: ClusterOnboardingConfig
            metadata: {{name: main, organization: {org}, cluster: c1}}
            spec:
              namespaces: [{{name: payments, desiredState: DESIRED_ONBOARDED}}]
            """
        )
    )
    out = shared_admin.ok("apply", "-f", str(manifest))
    assert f"Profile organizations/{org}/tenants/t1/profiles/strict created" in out
    assert f"ClusterOnboardingConfig organizations/{org}/clusters/c1/onboarding/main created" in out
    with mgmt.admin() as http:
        profile = as_json(http.get(f"/v2/organizations/{org}/tenants/t1/profiles/strict"))
        assert profile["mandates"] == {"traffic": {"timeout": "5s"}}
        config = as_json(http.get(f"/v2/organizations/{org}/clusters/c1/onboarding/main"))
        assert config["namespaces"][0]["name"] == "payments"

    listed = json.loads(
        shared_admin.ok("get", "profiles", "--org", org, "--tenant", "t1", "-o", "json")
    )
    assert [item["metadata"]["name"] for item in listed["items"]] == ["strict"]
    got = yaml.safe_load(
        shared_admin.ok("get", "onboarding", "main", "--org", org, "--cluster", "c1", "-o", "yaml")
    )
    assert got["kind"] == "ClusterOnboardingConfig" and got["spec"]["namespaces"]

    shared_admin.ok("delete", "profile", "strict", "--org", org, "--tenant", "t1")
    with mgmt.admin() as http:
        assert http.get(f"/v2/organizations/{org}/tenants/t1/profiles/strict").status_code == 404
    shared_admin.ok("delete", "organization", org, "--force", "--yes")


def test_apply_gateway_routes_and_backends(shared_admin: Meshctl, mgmt: ManagementPlane) -> None:
    """HTTPRoute and Backend apply like any kind; a full Gateway API manifest as the
    inner spec is what the server stores, so applying it again changes nothing."""
    org = unique("routes")
    where = f"organization: {org}, cluster: c"
    text = textwrap.dedent(
        f"""\
        kind: Organization
        metadata: {{name: {org}}}
        ---
        kind: Cluster
        metadata: {{name: c, organization: {org}}}
        ---
        kind: HTTPRoute
        metadata: {{name: shop.web, {where}}}
        spec:
          apiVersion: gateway.networking.k8s.io/v1
          kind: HTTPRoute
          metadata: {{namespace: shop, name: web}}
          spec:
            rules:
            - matches: [{{path: {{type: PathPrefix, value: /api}}}}]
              backendRefs:
              - {{name: api, port: 8080}}
              - {{group: gateway.envoyproxy.io, kind: Backend, name: legacy}}
        ---
        kind: Backend
        metadata: {{name: shop.legacy, {where}}}
        spec:
          apiVersion: gateway.envoyproxy.io/v1alpha1
          kind: Backend
          metadata: {{namespace: shop, name: legacy}}
          spec:
            endpoints: [{{fqdn: {{hostname: legacy.example.com, port: 80}}}}]
        """
    )
    out = shared_admin.ok("apply", "-f", "-", input=text)
    assert out.count(" created") == 4, out
    again = shared_admin.ok("apply", "-f", "-", input=text)
    assert "httproute" in again and "backend" in again and again.count(" unchanged") == 4, again
    base = f"/v2/organizations/{org}/clusters/c"
    with mgmt.admin() as http:
        route = as_json(http.get(f"{base}/httproutes/shop.web"))
        backend = as_json(http.get(f"{base}/backends/shop.legacy"))
    assert route["spec"]["rules"][0]["backendRefs"][1]["kind"] == "Backend"
    assert backend["spec"]["endpoints"] == [
        {"fqdn": {"hostname": "legacy.example.com", "port": 80}}
    ]
    assert "shop.web" in shared_admin.ok("get", "routes", "--org", org, "--cluster", "c")
    shared_admin.ok("delete", "backend", "shop.legacy", "--org", org, "--cluster", "c")
    with mgmt.admin() as http:
        assert http.get(f"{base}/backends/shop.legacy").status_code == 404
