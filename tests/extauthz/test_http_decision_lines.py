"""extauthz's HTTP mode says why as the gRPC mode does: the same deny, through
either mode, carries ``x-meshplane-denied`` and an ``x-decision-id``, and
leaves exactly one decision line under that id, the same line but for the id
and the time (one recorder writes both: ``extauthz.decisions``)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from meshplane.decision_log import DECISION_ID_HEADER, DENIED_HEADER, DecisionLogSettings
from tests.support.processes import wait_until

from .jwtkit import HS_SECRET, claims, make_token
from .policies import write_policies
from .support import GrpcClient, ServerThread, app_factory, check_request, http_check


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerThread, Path]]:
    os.environ["EXTAUTHZ_TEST_SECRET"] = HS_SECRET.decode()
    try:
        tmp = tmp_path_factory.mktemp("http-lines")
        config = write_policies(tmp)
        lines = tmp / "decisions.jsonl"
        factory = app_factory(config, decision_log=DecisionLogSettings(path=str(lines)))
        with ServerThread(factory) as server:
            yield server, lines
    finally:
        os.environ.pop("EXTAUTHZ_TEST_SECRET", None)


def _lines(path: Path, decision_id: str) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    found = [json.loads(text) for text in path.read_text().splitlines()]
    return [line for line in found if line.get("decision_id") == decision_id]


def test_a_deny_in_either_mode_names_its_one_line(served: tuple[ServerThread, Path]) -> None:
    server, path = served
    bearer = "Bearer " + make_token(claims(time.time(), "/headers", sub="alice"))
    http = http_check(server.http_port, "/check/hs/private", [("authorization", bearer)])
    assert http.status == 403
    assert http.header(DENIED_HEADER) == "extauthz path_not_allowed"
    client = GrpcClient(server.port)
    try:
        grpc = client.check(check_request("/private", {"authorization": bearer}, policy="hs"))
    finally:
        client.close()
    headers = {h.header.key: h.header.value for h in grpc.denied_response.headers}
    assert headers[DENIED_HEADER] == "extauthz path_not_allowed"
    ids = [http.header(DECISION_ID_HEADER), headers[DECISION_ID_HEADER]]
    assert all(ids) and ids[0] != ids[1]
    found = []
    for decision_id in ids:
        assert decision_id is not None
        wait_until(partial(_lines, path, decision_id), 30, f"the line of {decision_id}")
        (line,) = _lines(path, decision_id)
        found.append(line)
    same = [
        {k: v for k, v in line.items() if k not in ("decision_id", "time", "ts")} for line in found
    ]
    assert same[0] == same[1]
    assert (same[0]["kind"], same[0]["rule"], same[0]["reason"]) == (
        "extauthz",
        "pathClaim",
        "path_not_allowed",
    )
    assert same[0]["path"] == "/private" and same[0]["policy"] == "hs"
    assert "alice" not in json.dumps(same[0])  # the principal is masked


def test_an_allow_sends_no_decision_id(served: tuple[ServerThread, Path]) -> None:
    server, _ = served
    bearer = "Bearer " + make_token(claims(time.time(), "/headers"))
    http = http_check(server.http_port, "/check/hs/headers", [("authorization", bearer)])
    assert http.status == 200
    assert http.header(DECISION_ID_HEADER) is None and http.header(DENIED_HEADER) is None
