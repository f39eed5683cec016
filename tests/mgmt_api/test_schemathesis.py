"""Schemathesis against /v2/openapi.json of a live server: no 5xx, no schema
violations, and data the document calls valid is not mostly refused.

Runs the schemathesis CLI (its supported interface) against a server
subprocess per store, with a bounded number of examples per operation and a
fixed seed so CI time stays predictable. SQLite gets three examples per
operation, PostgreSQL one (:data:`EXAMPLES`): every operation of the document
is still called on each store (the JUnit report is checked for it), and the
cases beyond the first, which exercise the same handlers, run once rather
than twice.

"Mostly rejected" (schemathesis' ``validation_mismatch`` warning: every valid
case of an operation got a 400) fails the run: the published schema must say
what the server enforces (etags, name patterns, no control characters). The
operations left out of that one check (:data:`MAY_REFUSE`) refuse
valid-looking data for reasons the schema does not state; each group says why.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from xml.etree import ElementTree

import httpx
import pytest

from tests.mgmt_api.harness import ADMIN_PASSWORD, MgmtServer, ok

CHECKS = ",".join(
    [
        "not_a_server_error",
        "status_code_conformance",
        "content_type_conformance",
        "response_schema_conformance",
        "negative_data_rejection",
    ]
)


#: Operations that may refuse valid-looking data, each group with its reason:
#: the one place where the schema does not (yet) say all the server enforces.
MAY_REFUSE = {
    # What this run configures none of: an identity provider
    # (FAILED_PRECONDITION; a callback also needs a real login's state), or a
    # directory to sync.
    "^/v2/oidc/|/directorySync$|:sync$",
    # Free-form documents (a Gateway API spec, profile defaults, an ext_authz
    # policy's JWT settings) checked by their kind's validator: JSON Schema
    # cannot carry the ban on control characters into "any JSON" values.
    "/(backends|backendtrafficpolicies|httproutes|profiles|extauthzpolicies)($|/)",
    # Rules across fields or objects: an approval's resource is the path's; a
    # binding names an existing role, the root policy keeps an rbac/admin one;
    # a new role has a rule; logger levels are one level or a list; a Redis URL
    # or a reference to one; service accounts only with mode CUSTOM.
    "/approvals|/policy$|^/v2/rbac$|/loggerlevels$|/clusters/[{]cluster[}]$|/settings($|/)",
    # Grammars stated in prose, not yet as patterns: a cluster/namespace
    # selector (workspaces, security groups, the service lookup), a grpc://
    # address, a config dump's field mask, a password's length.
    "/workspaces$|/workspaces/[{]workspace[}]$|/securitygroups$|/lookup/services$",
    "/envoyconfig$|/configdump$|/users/[{]user[}]$",
}

#: The schemathesis configuration: data the document calls valid that every
#: case of an operation got refused (``validation_mismatch``) fails the run.
CONFIG = """
[warnings]
fail-on = ["validation_mismatch"]

# A page token is one the server issued: the first page has none.
[parameters]
"query.pageToken" = ""
""" + "".join(
    f"\n[[operations]]\ninclude-path-regex = '{regex}'\nwarnings = false\n"
    for regex in sorted(MAY_REFUSE)
)


#: Examples per operation, by store: the full budget on one, at least one
#: case of every operation on the other.
EXAMPLES = {"sqlite": 3, "postgresql": 1}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("backend", sorted(EXAMPLES, reverse=True))
def test_schemathesis_finds_no_5xx_and_no_schema_violation(
    backend: str, database_factory: Callable[[str], str | None], tmp_path: Path
) -> None:
    # Its own server: the fuzzer acts as admin and may delete or rewrite anything.
    server = MgmtServer(database_factory(backend)).start()
    try:
        _run(server, tmp_path, EXAMPLES[backend])
    finally:
        server.close()


def operations(schema: Path) -> set[str]:
    """``METHOD /path`` of every operation the document declares."""
    paths = json.loads(schema.read_text())["paths"]
    methods = {"get", "put", "post", "delete", "patch"}
    return {f"{m.upper()} {path}" for path, item in paths.items() for m in item if m in methods}


def operations_run(report_dir: Path) -> set[str]:
    """The operations the JUnit report shows run, none skipped."""
    (report,) = report_dir.glob("junit-*.xml")
    cases = ElementTree.parse(report).getroot().iter("testcase")
    return {case.attrib["name"] for case in cases if case.find("skipped") is None}


def ok_bytes(response: httpx.Response) -> bytes:
    assert response.status_code == 200, response.text
    return response.content


def _run(server: MgmtServer, tmp_path: Path, examples: int) -> None:
    # Some real objects, so generated requests also reach existing resources.
    with server.admin() as admin:
        resp = admin.post("/v2/organizations", json={"name": "fuzz", "organization": {}})
        assert resp.status_code in (200, 409)
        admin.post("/v2/organizations/fuzz/clusters", json={"name": "c", "cluster": {}})
        schema = tmp_path / "openapi.json"  # the document itself needs credentials
        schema.write_bytes(ok_bytes(admin.get("/v2/openapi.json")))
    cli = Path(sys.executable).with_name("schemathesis")
    config = tmp_path / "schemathesis.toml"
    config.write_text(CONFIG)
    result = subprocess.run(
        [
            str(cli),
            "--config-file",
            str(config),
            "run",
            str(schema),
            "--url",
            server.url,
            "--auth",
            f"admin:{ADMIN_PASSWORD}",
            "--max-examples",
            str(examples),
            "--phases",
            "examples,fuzzing",
            "--checks",
            CHECKS,
            "--no-shrink",
            "--generation-database",
            "none",
            "--seed",
            "20261122",
            # One worker: schemathesis' threads race inside hypothesis' lambda
            # introspection ("AST constructor recursion depth mismatch"), a tool
            # error that once failed CI with nothing wrong in the API.
            "--workers",
            "1",
            "--no-color",
            "--report",
            "junit",
            "--report-dir",
            str(tmp_path),
        ],
        capture_output=True,
        check=False,
        text=True,
        timeout=600,
        env={**os.environ, "NO_COLOR": "1"},
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    assert operations_run(tmp_path) == operations(schema), result.stdout[-3000:]
    with httpx.Client(base_url=server.url, timeout=10) as anon:  # still alive and serving
        ok(anon.get("/readyz"))
