"""The six proxytools endpoints end to end: REST → mgmt-api → tunnel → agent → real Envoys.

Values are checked against the Envoy admin API called directly. Also: a
level set through ``PUT loggerlevels`` shows in ``/logging``; ``streamlogs``
follows a line Envoy writes after the stream started (and across a log
rotation), and the agent stops tailing when the client goes away; no
answer carries a secret (config dump, a jwt_authn provider's JWK ``k``
included, server info, stats, clusters, logger levels, log lines), while
ordinary values stay; bad fields are 400 naming
the field.
"""

from __future__ import annotations

import json
import threading
import uuid
from typing import Any

import httpx

from agent.redact import REDACTED
from tests.agent.fleet import SECRETS, VISIBLE, Fleet, wait_ok
from tests.mgmt_api.harness import err, ok
from tests.support.processes import wait_until

WEB = {"namespace": "shop", "workload": "web"}
API = {"namespace": "shop", "workload": "api"}


def _by_instance(answer: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {item["instance"]: item for item in answer["instances"]}


def test_clusterstats_match_the_admin_api(fleet: Fleet) -> None:
    answer = _by_instance(wait_ok(fleet.admin, "POST", fleet.path("clusterstats"), WEB))
    assert sorted(answer) == ["web-1", "web-2"]  # every instance, each answered
    for instance, item in answer.items():
        direct = fleet.envoys[instance].admin("GET", "/clusters?format=json").json()
        names = [c["name"] for c in item["clusterStats"]["cluster_statuses"]]
        assert names == [c["name"] for c in direct["cluster_statuses"]] == ["backend"]
        assert item["namespace"] == "shop" and item["workload"] == "web"


def test_serverstats_filter_and_server_info(fleet: Fleet) -> None:
    stats_filter = r"^server\.(live|concurrency)$"
    body: dict[str, str | bool] = {**WEB, "instance": "web-2", "filter": stats_filter}
    # A filtered call answers the stats it asked for, nothing else: server info is opt-in.
    [plain] = ok(fleet.admin.post(fleet.path("serverstats"), json=body))["instances"]
    assert "serverInfo" not in plain
    assert {s["name"] for s in plain["stats"]} == {"server.concurrency", "server.live"}
    body["includeServerInfo"] = True
    answer = ok(fleet.admin.post(fleet.path("serverstats"), json=body))
    [item] = answer["instances"]
    direct_info = fleet.envoys["web-2"].admin("GET", "/server_info").json()
    assert item["serverInfo"]["node"]["id"] == direct_info["node"]["id"] == "web-2"
    assert item["serverInfo"]["version"] == direct_info["version"]
    stats = {s["name"]: s["value"] for s in item["stats"] if "name" in s}
    assert stats == {"server.concurrency": 1, "server.live": 1}
    direct = fleet.envoys["web-2"].admin(
        "GET", "/stats", params={"format": "json", "filter": stats_filter}
    )
    assert {s["name"] for s in direct.json()["stats"]} == set(stats)
    # usedonly drops stats never written to
    used = ok(fleet.admin.post(fleet.path("serverstats"), json={**body, "usedOnly": True}))
    direct_used = fleet.envoys["web-2"].admin(
        "GET", "/stats?format=json&usedonly&filter=" + stats_filter.replace("\\", "%5C")
    )
    assert {s["name"] for s in used["instances"][0]["stats"] if "name" in s} == {
        s["name"] for s in direct_used.json()["stats"]
    }


def _leaks(answer: Any) -> list[str]:
    text = json.dumps(answer)
    planted = [*SECRETS.values(), "hunter2", "MIIEnode", "MHcCAQEE", "ak-123456", "PRIVATE KEY"]
    return [secret for secret in planted if secret in text]


def _local_jwks(answer: Any) -> str:
    """The ``local_jwks.inline_string`` of the one jwt_authn provider in the answer
    (the bootstrap's and the listeners' dumps both show it)."""
    found: list[str] = []

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            if isinstance(value.get("local_jwks"), dict):
                found.append(value["local_jwks"]["inline_string"])
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    walk(answer)
    assert found and len(set(found)) == 1, found
    return found[0]


def test_configdump_is_redacted(fleet: Fleet) -> None:
    direct = fleet.envoys["api-1"].admin("GET", "/config_dump").text
    # The dump Envoy itself serves holds the secrets ...
    for secret in ("hunter2-cluster-password", "MIIEnode", "ak-123456", *SECRETS.values()):
        if secret != SECRETS["generic_secret"]:  # Envoy hides this one itself
            assert secret in direct, secret
    answer = ok(fleet.admin.post(fleet.path("configdump"), json=API))
    # ... and none of them leaves the cluster; ordinary values, however named, do.
    assert _leaks(answer) == []
    text = json.dumps(answer)
    for name, value in VISIBLE.items():
        assert json.dumps(value) in text, name
    for reference in (
        '"client_id": "visible-client"',
        '"name": "oauth-token"',
        "BEGIN CERTIFICATE",
    ):
        assert reference in text, reference
    # The local JWT keys' JWKS (jwt_authn local_jwks, as a gateway gets it over ADS):
    # still a JWKS, its HMAC key (JWK k) redacted, its public members readable.
    inline = _local_jwks(answer)
    assert json.loads(inline)["keys"] == [{"kty": "oct", "alg": "HS256", "kid": "h", "k": REDACTED}]
    [item] = answer["instances"]
    assert item["redactedFields"] >= 15
    kinds = [c["@type"].rsplit(".", 1)[1] for c in item["configDump"]["configs"]]
    assert "BootstrapConfigDump" in kinds and "ClustersConfigDump" in kinds
    # resource narrows it, as on the admin API
    narrowed = ok(
        fleet.admin.post(
            fleet.path("configdump"),
            json={**API, "resource": "static_clusters", "mask": "cluster.name"},
        )
    )
    configs = narrowed["instances"][0]["configDump"]["configs"]
    assert [c["cluster"]["name"] for c in configs] == ["backend"]


def test_no_diagnostics_answer_carries_a_secret(fleet: Fleet) -> None:
    """server info (node metadata, --config-yaml), stats, clusters, logger levels, logs."""
    envoy = fleet.envoys["api-1"]
    assert SECRETS["db_password"] in envoy.admin("GET", "/server_info").text
    info = ok(fleet.admin.post(fleet.path("serverstats"), json={**API, "includeServerInfo": True}))
    assert _leaks(info) == []
    [item] = info["instances"]
    metadata = item["serverInfo"]["node"]["metadata"]
    assert metadata["db_password"] == metadata["auth_token"] == metadata["X-Api-Key"] == REDACTED
    assert metadata["keyspace"] == VISIBLE["keyspace"] and item["stats"]
    assert REDACTED in item["serverInfo"]["command_line_options"]["config_yaml"]
    for endpoint in ("clusterstats", "loggerlevels"):
        assert _leaks(ok(fleet.admin.post(fleet.path(endpoint), json=API))) == [], endpoint
    levels = ok(fleet.admin.post(fleet.path("loggerlevels"), json=API))["instances"][0]["levels"]
    assert levels["secret"] in ("info", "warning", "debug", "trace", "error", "critical", "off")

    # Envoy's debug log shows request headers and paths: credentials in them stay here.
    assert envoy.admin("POST", "/logging?paths=http:debug,admin:debug").status_code == 200
    marker = f"marker-{uuid.uuid4().hex}"
    bearer, api_key, cookie, query = (f"{kind}-{uuid.uuid4().hex}" for kind in "bacq")
    headers = {"authorization": f"Bearer {bearer}", "x-api-key": api_key, "cookie": f"s={cookie}"}
    envoy.admin("GET", f"/ready?{marker}&api_key={query}", headers=headers)
    assert envoy.log_path is not None
    wait_until(
        lambda: all(s in envoy.log_path.read_text() for s in (marker, bearer, api_key, query)),  # type: ignore[union-attr]
        what="Envoy to log the request",
    )
    envoy.admin("POST", "/logging?paths=http:info,admin:info")
    response = fleet.admin.post(fleet.path("streamlogs"), json={**API, "tailLines": 400})
    lines = [json.loads(raw)["line"] for raw in response.text.splitlines()]
    assert any(marker in line for line in lines)
    for secret in (bearer, api_key, cookie, query):
        assert not any(secret in line for line in lines), secret
    assert any("'authorization', '[redacted]'" in line for line in lines)


def test_logger_levels_read_and_set(fleet: Fleet) -> None:
    answer = ok(fleet.admin.post(fleet.path("loggerlevels"), json=WEB))
    for item in answer["instances"]:
        direct = fleet.envoys[item["instance"]].admin("POST", "/logging").text
        assert f"  upstream: {item['levels']['upstream']}" in direct
    set_body = {**WEB, "instance": "web-1", "loggers": {"upstream": "trace", "pool": "error"}}
    changed = ok(fleet.admin.put(fleet.path("loggerlevels"), json=set_body))
    assert changed["instances"][0]["levels"]["upstream"] == "trace"
    direct = fleet.envoys["web-1"].admin("POST", "/logging").text
    assert "  upstream: trace" in direct and "  pool: error" in direct
    assert "  upstream: trace" not in fleet.envoys["web-2"].admin("POST", "/logging").text
    everything = ok(fleet.admin.put(fleet.path("loggerlevels"), json={**WEB, "level": "info"}))
    assert {lvl for item in everything["instances"] for lvl in item["levels"].values()} == {"info"}
    # audited, with who asked and what each instance answered
    logs = ok(fleet.admin.get("/v2/organizations/diag/auditlogs"))["auditLogs"]
    sets = [entry for entry in logs if entry["operation"] == "SET_LOGGER_LEVELS"]
    assert sets[0]["properties"]["level"] == "info"
    assert sets[0]["properties"]["outcome"] == {"web-1": "OK", "web-2": "OK"}
    assert sets[1]["properties"]["loggers"] == {"upstream": "trace", "pool": "error"}


def test_bad_fields_are_400_naming_the_field(fleet: Fleet) -> None:
    cases: list[tuple[str, str, dict[str, Any], str]] = [
        ("POST", "serverstats", {**WEB, "filter": "(unclosed"}, "filter"),
        ("POST", "serverstats", {**WEB, "filter": "(?=lookahead)"}, "filter"),  # RE2 refuses
        ("PUT", "loggerlevels", {**WEB, "level": "loud"}, "level"),
        ("PUT", "loggerlevels", {**WEB, "loggers": {"upstream": "loud"}}, "loggers.upstream"),
        ("PUT", "loggerlevels", {**WEB}, "level"),
        ("POST", "configdump", {**WEB, "resource": "a&b"}, "resource"),
        ("POST", "serverstats", {**WEB, "usedOnly": "yes"}, "usedOnly"),  # never coerced
        ("POST", "clusterstats", {"namespace": "shop"}, "workload"),
        ("POST", "clusterstats", {**WEB, "instance": "../quitquitquit"}, "instance"),
        ("POST", "streamlogs", {**WEB, "tailLines": -1}, "tailLines"),
    ]
    for method, endpoint, body, field in cases:
        response = fleet.admin.request(method, fleet.path(endpoint), json=body)
        error = err(response, 400, "INVALID_ARGUMENT")
        violations = [d for d in error["details"] if "fieldViolations" in d]
        assert violations and violations[0]["fieldViolations"][0]["field"] == field, (body, error)


def test_unknown_workload_is_404(fleet: Fleet) -> None:
    response = fleet.admin.post(fleet.path("serverstats"), json={**WEB, "workload": "nope"})
    assert "shop/nope" in err(response, 404, "NOT_FOUND")["message"]
    response = fleet.admin.post(fleet.path("serverstats"), json={**WEB, "instance": "web-9"})
    err(response, 404, "NOT_FOUND")


def test_streamlogs_tail_then_follow_a_new_line_and_stop_when_the_client_leaves(
    fleet: Fleet,
) -> None:
    envoy = fleet.envoys["web-1"]
    assert envoy.admin("POST", "/logging?admin=debug").status_code == 200
    marker = f"marker-{uuid.uuid4().hex}"
    lines: list[dict[str, Any]] = []
    opened = threading.Event()
    body = {**WEB, "instance": "web-1", "follow": True, "tailLines": 1}
    active = 'meshplane_agent_active_calls{operation="stream_logs"}'
    with httpx.Client(base_url=fleet.mgmt.url, auth=("admin", "admin-password-for-tests")) as c:
        with c.stream("POST", fleet.path("streamlogs"), json=body, timeout=60) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("application/x-ndjson")
            opened.set()
            # Envoy writes the marker after the stream started (debug line of the admin request)
            wait_until(lambda: fleet.agent.metric(active) == 1, what="the stream to start")
            envoy.admin("GET", f"/ready?{marker}")
            for raw in response.iter_lines():
                line = json.loads(raw)
                lines.append(line)
                if marker in line.get("line", ""):
                    break
        # the client went away: the agent stops tailing
        wait_until(lambda: fleet.agent.metric(active) == 0, timeout=30, what="tailing to stop")
    assert lines[0]["instance"] == "web-1" and lines[0]["time"].endswith("Z")
    assert marker in lines[-1]["line"]
    envoy.admin("POST", "/logging?admin=info")


def test_streamlogs_survives_rotation_and_serves_sse(fleet: Fleet) -> None:
    envoy = fleet.envoys["api-1"]
    assert envoy.log_path is not None
    envoy.admin("POST", "/logging?admin=debug")
    before, after = f"before-{uuid.uuid4().hex}", f"after-{uuid.uuid4().hex}"
    body = {**API, "follow": True, "tailLines": 0}
    seen: list[str] = []
    headers = {"accept": "text/event-stream"}
    with httpx.Client(base_url=fleet.mgmt.url, auth=("admin", "admin-password-for-tests")) as c:
        with c.stream(
            "POST", fleet.path("streamlogs"), json=body, headers=headers, timeout=60
        ) as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            envoy.admin("GET", f"/ready?{before}")
            for raw in r.iter_lines():
                if not raw.startswith("data: "):
                    continue
                line = json.loads(raw[len("data: ") :]).get("line", "")
                seen.append(line)
                if before in line:
                    # rotate as logrotate does: rename, then tell Envoy to reopen
                    envoy.log_path.rename(envoy.log_path.with_suffix(".log.1"))
                    assert envoy.admin("POST", "/reopen_logs").status_code == 200
                    wait_until(envoy.log_path.exists, what="Envoy to reopen its log")
                    envoy.admin("GET", f"/ready?{after}")
                if after in line:
                    break
    assert any(before in s for s in seen) and after in seen[-1]
    envoy.admin("POST", "/logging?admin=info")


def test_streamlogs_without_follow_ends(fleet: Fleet) -> None:
    body = {**WEB, "tailLines": 3}
    response = fleet.admin.post(fleet.path("streamlogs"), json=body)
    assert response.status_code == 200
    lines = [json.loads(raw) for raw in response.text.splitlines()]
    assert len(lines) == 6  # three from each instance
    assert {line["instance"] for line in lines} == {"web-1", "web-2"}
    direct = fleet.envoys["web-2"].log_path
    assert direct is not None
    tail = direct.read_text().splitlines()[-3:]
    assert [line["line"] for line in lines if line["instance"] == "web-2"] == tail


def test_openapi_documents_the_records(fleet: Fleet) -> None:
    doc = ok(fleet.admin.get("/v2/openapi.json"))
    schemas = doc["components"]["schemas"]
    for record in (
        "GetClusterStatsResponse",
        "GetConfigDumpResponse",
        "GetServerStatsResponse",
        "LoggerLevelsResponse",
        "LogLine",
    ):
        assert record in schemas, record
    prefix = "/v2/organizations/{organization}/clusters/{cluster}/proxytools"
    paths = doc["paths"]
    assert set(paths[prefix + "/loggerlevels"]) == {"post", "put"}
    for endpoint in ("clusterstats", "serverstats", "configdump", "streamlogs"):
        assert "post" in paths[f"{prefix}/{endpoint}"]
