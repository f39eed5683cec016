"""Decision logs, pure parts (table-tested) and the writer with an in-memory stream.

The writer test uses an io.StringIO as its stream (what stderr would be) and
a one-line queue to force drops; the services' end-to-end lines are checked
through a real gateway in tests/gateway/test_gateway_behaviour.py.
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import io
import json
from pathlib import Path
from typing import Any

import pytest
from envoy.service.auth.v3 import external_auth_pb2
from envoy.service.ratelimit.v3 import rls_pb2
from prometheus_client import REGISTRY

from extauthz.decisions import DecisionRecorder as AuthzRecorder
from extauthz.decisions import claimed_subject, decision_line
from extauthz.reasons import Decision, Reason, deny
from meshplane.config_error import ConfigError
from meshplane.decision_log import (
    DecisionLog,
    DecisionLogSettings,
    add_arguments,
    mask,
    parse_traceparent,
    rfc3339,
    sampled,
    settings_from_args,
)
from ratelimit.config import RateLimit
from ratelimit.decisions import decision_line as ratelimit_line
from ratelimit.decisions import header_entry, hits
from ratelimit.plan import DescriptorPlan, Plan
from ratelimit.settings import parse_settings
from ratelimit.store import Outcome
from tests.support.otlp_logs_receiver import OtlpLogsReceiver

SALT = b"0123456789abcdef0123456789abcdef"
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (f"00-{TRACE}-00f067aa0ba902b7-01", TRACE),
        (f" 00-{TRACE}-00f067aa0ba902b7-00 ", TRACE),
        (f"01-{TRACE}-00f067aa0ba902b7-01-future", TRACE),  # later versions may add fields
        (f"00-{TRACE}-00f067aa0ba902b7-01-extra", None),  # version 00 may not
        (f"ff-{TRACE}-00f067aa0ba902b7-01", None),
        (f"00-{'0' * 32}-00f067aa0ba902b7-01", None),
        (f"00-{TRACE}-{'0' * 16}-01", None),
        (f"00-{TRACE.upper()}-00f067aa0ba902b7-01", None),
        ("00-abc-def-01", None),
        ("", None),
        (None, None),
        ("0" * 600, None),
    ],
)
def test_traceparent(header: str | None, expected: str | None) -> None:
    assert parse_traceparent(header) == expected


@pytest.mark.parametrize(
    ("value", "salt", "show", "expected_clear"),
    [
        ("alice", SALT, False, False),
        ("alice", SALT, True, True),
        ("", SALT, False, False),
    ],
)
def test_masking(value: str, salt: bytes, show: bool, expected_clear: bool) -> None:
    settings = DecisionLogSettings(salt=salt)
    shown = settings.shown(value, show)
    if expected_clear:
        assert shown == value
    else:
        assert shown.startswith("h:") and len(shown) == 18
        assert shown == mask(value, salt)  # stable under one salt: lines group by caller
        assert mask(value, b"another salt, another process!!") != shown


@pytest.mark.parametrize(
    ("rate", "draw", "kept"),
    [(0.0, 0.0, False), (0.1, 0.05, True), (0.1, 0.1, False), (1.0, 0.999, True)],
)
def test_sampling(rate: float, draw: float, kept: bool) -> None:
    assert sampled(rate, draw) is kept


def test_rfc3339() -> None:
    assert rfc3339(0.5) == "1970-01-01T00:00:00.500Z"


def _token(payload: object) -> str:
    body = base64.urlsafe_b64encode(json.dumps(payload).encode()).rstrip(b"=").decode()
    return f"Bearer eyJhbGciOiJIUzI1NiJ9.{body}.c2lnbmF0dXJl"


@pytest.mark.parametrize(
    ("authorization", "expected"),
    [
        ((_token({"sub": "alice"}),), "alice"),
        ((_token({"sub": 7}),), None),
        ((_token(["sub"]),), None),
        ((_token({"sub": "a"}), _token({"sub": "b"})), None),
        (("Basic dXNlcjpwYXNz",), None),
        (("Bearer not-a-jwt",), None),
        (("Bearer a.%%%.c",), None),
        ((), None),
    ],
)
def test_claimed_subject(authorization: tuple[str, ...], expected: str | None) -> None:
    assert claimed_subject(authorization) == expected


def test_an_extauthz_line_names_everything_but_the_token() -> None:
    settings = DecisionLogSettings(salt=SALT)
    line = decision_line(
        deny(Reason.EXPIRED, "jwt"),
        "id-1",
        0.0,
        method="POST",
        path="/x",
        traceparent=f"00-{TRACE}-00f067aa0ba902b7-01",
        subject="alice",
        show_principal=False,
        salt_mask=settings.shown,
    )
    assert line == {
        "decision_id": "id-1",
        "trace_id": TRACE,
        "time": "1970-01-01T00:00:00.000Z",
        "decision": "deny",
        "kind": "extauthz",
        "policy": "jwt",
        "rule": "jwt.leewaySeconds",
        "reason": "expired",
        "method": "POST",
        "path": "/x",
        "principal": mask("alice", SALT),
        "principal_verified": False,
    }


class _Capture:
    """A fake DecisionLog (named so): keeps the submitted lines in a list."""

    def __init__(self, settings: DecisionLogSettings) -> None:
        self.settings = settings
        self.lines: list[object] = []

    def submit(self, line: object, size: int = 0) -> bool:
        self.lines.append(line)
        return True


@pytest.mark.parametrize(
    ("decision", "rate", "draw", "logged"),
    [
        (deny(Reason.EXPIRED), 0.0, 0.9, True),  # every deny
        (Decision(True, Reason.OK, "jwt"), 0.0, 0.0, False),  # allows: default 0
        (Decision(True, Reason.OK, "jwt"), 0.5, 0.25, True),
        (Decision(True, Reason.OK, "jwt"), 0.5, 0.75, False),
    ],
)
def test_extauthz_recorder_samples_allows_with_fake_capture(
    decision: Decision, rate: float, draw: float, logged: bool
) -> None:
    capture = _Capture(DecisionLogSettings(allow_sample=rate, salt=SALT))
    recorder = AuthzRecorder(capture, clock=lambda: 0.0, draw=lambda: draw)  # type: ignore[arg-type]
    decision_id = recorder.record(external_auth_pb2.CheckRequest(), decision, ())
    assert (decision_id is not None) is logged
    assert len(capture.lines) == int(logged)


OTHER = "0af7651916cd43dd8448eb211c80319c"


@pytest.mark.parametrize(
    ("header", "call", "expected"),
    [
        (TRACE, None, TRACE),  # the caller's traceparent
        (None, OTHER, OTHER),  # none: the trace the proxy started (the call's metadata)
        (TRACE, OTHER, TRACE),  # both: the request's own
        (None, None, None),
    ],
)
def test_extauthz_trace_id_is_the_requests_else_the_calls_with_fake_capture(
    header: str | None, call: str | None, expected: str | None
) -> None:
    capture = _Capture(DecisionLogSettings(salt=SALT))
    recorder = AuthzRecorder(capture, clock=lambda: 0.0)  # type: ignore[arg-type]
    request = external_auth_pb2.CheckRequest()
    if header is not None:
        request.attributes.request.http.headers["traceparent"] = f"00-{header}-00f067aa0ba902b7-01"
    traceparent = None if call is None else f"00-{call}-b7ad6b7169203331-01"
    recorder.record(request, deny(Reason.EXPIRED), (), traceparent)
    (build,) = capture.lines
    assert build()["trace_id"] == expected  # type: ignore[operator]


def _limit(shadow: bool) -> RateLimit:
    return RateLimit(
        requests_per_unit=3,
        unit="minute",
        window_seconds=60,
        name=None,
        unlimited=False,
        replaces=frozenset(),
        shadow_mode=shadow,
        domain="d",
        rule_id="k",
    )


@pytest.mark.parametrize(
    ("fits", "shadows", "expected"),
    [
        ((True, True), (False, False), []),
        ((False, True), (False, False), [(0, False)]),
        ((True, False), (False, True), [(1, True)]),
    ],
)
def test_ratelimit_hits(
    fits: tuple[bool, ...], shadows: tuple[bool, ...], expected: list[tuple[int, bool]]
) -> None:
    descriptors = tuple(
        DescriptorPlan(_limit(shadow), index, 1) for index, shadow in enumerate(shadows)
    )
    plan = Plan("d", True, descriptors, (), {})
    outcome = Outcome(
        allowed=all(f or s for f, s in zip(fits, shadows, strict=True)), counts=(0, 0), fits=fits
    )
    assert hits(plan, outcome) == expected


def test_a_ratelimit_line_names_policy_rule_and_reason() -> None:
    """The enforced hit's rule refused, not the shadow one listed first."""
    enforced = dataclasses.replace(_limit(False), rule_id="enforced")
    descriptors = (DescriptorPlan(_limit(True), 0, 1), DescriptorPlan(enforced, 1, 1))
    plan = Plan("c/default/p", True, descriptors, (), {})
    line = ratelimit_line(plan, [[("a", "1")], [("b", "2")]], [(0, True), (1, False)], "id", 0.0,
                          over=True, shown=lambda v: v)  # fmt: skip
    assert (line["kind"], line["policy"], line["rule"], line["reason"], line["decision"]) == (
        "ratelimit",
        "c/default/p",
        "enforced",
        "over_limit",
        "over_limit",
    )


def test_the_header_entry_is_a_response_header_to_add() -> None:
    response = rls_pb2.RateLimitResponse.FromString(header_entry("ab" * 16))
    (entry,) = response.response_headers_to_add
    assert (entry.key, entry.value) == ("x-decision-id", "ab" * 16)


def test_the_writer_writes_json_lines_drops_when_full_and_flushes_on_close() -> None:
    stream = io.StringIO()
    log = DecisionLog("test", DecisionLogSettings(queue_lines=1, salt=SALT), stream=stream)
    submitted = [log.submit({"decision_id": str(i)}) for i in range(2000)]
    log.close()
    written = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [w["decision_id"] for w in written] == [
        str(i) for i, kept in enumerate(submitted) if kept
    ]
    assert written[0]["service"] == "test" and written[0]["msg"] == "decision"
    assert not all(submitted)  # a one-line queue under 2000 puts must drop some
    dropped = REGISTRY.get_sample_value("test_decision_log_dropped_total", {"cause": "queue_full"})
    assert dropped == submitted.count(False)


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["--decision-log-allow-sample", "1.5"], "--decision-log-allow-sample"),
        (["--decision-log-queue", "0"], "--decision-log-queue"),
        (["--decision-log-otlp", "nohost"], "--decision-log-otlp"),
        (["--decision-log-salt-file", "/nonexistent/salt"], "--decision-log-salt-file"),
    ],
)
def test_bad_flags_name_the_flag(argv: list[str], error: str) -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser, values_noun="values")
    with pytest.raises(ValueError, match=error):
        settings_from_args(parser.parse_args(argv))


def test_flags_off_and_path() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser, values_noun="values")
    assert not settings_from_args(parser.parse_args(["--decision-log", "off"])).enabled
    settings = settings_from_args(parser.parse_args(["--decision-log", "/tmp/d.log"]))
    assert settings.path == "/tmp/d.log" and settings.enabled and not settings.show_values


def test_lines_are_exported_as_otlp_logs_to_a_real_receiver() -> None:
    with OtlpLogsReceiver() as receiver:
        settings = DecisionLogSettings(
            salt=SALT, otlp_endpoint=receiver.endpoint, path=None, queue_lines=100
        )
        log = DecisionLog("otlptest", settings, stream=io.StringIO())
        line = {"decision_id": "d-1", "trace_id": TRACE, "principal": None, "reason": "expired"}
        assert log.submit(line)
        log.close()  # drain: flushes the export too
        ((service, record),) = receiver.records()
    assert service == "otlptest"
    assert record.trace_id.hex() == TRACE
    body = {kv.key: kv.value.string_value for kv in record.body.kvlist_value.values}
    assert body["decision_id"] == "d-1" and body["reason"] == "expired"
    assert REGISTRY.get_sample_value(
        "otlptest_decision_log_dropped_total", {"cause": "export_failed"}
    ) in (None, 0.0)


def test_a_failed_export_is_counted_and_the_line_still_written() -> None:
    with OtlpLogsReceiver() as receiver:
        endpoint = receiver.endpoint  # a port nothing listens on once the block ends
    stream = io.StringIO()
    log = DecisionLog(
        "otlpdown", DecisionLogSettings(salt=SALT, otlp_endpoint=endpoint), stream=stream
    )
    log.submit({"decision_id": "d-2"})
    log.close()
    assert json.loads(stream.getvalue())["decision_id"] == "d-2"
    assert (
        REGISTRY.get_sample_value("otlpdown_decision_log_dropped_total", {"cause": "export_failed"})
        == 1.0
    )


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        ({"decisionLog": {"allowSample": 2}}, "decisionLog.allowSample"),
        ({"decisionLog": {"show": "yes"}}, "decisionLog.show"),
        ({"decisionLog": {"queueLines": 0}}, "decisionLog.queueLines"),
        ({"decisionLog": {"otlpEndpoint": "nohost"}}, "decisionLog"),
        ({"decisionLog": {"pth": "/x"}}, "decisionLog"),
    ],
)
def test_a_bad_settings_section_is_a_located_error(doc: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_settings(doc, "settings.yaml")
    assert caught.value.field is not None and caught.value.field.startswith(field)
    assert "settings.yaml" in str(caught.value)


def test_flags_override_the_settings_file() -> None:
    doc = {"decisionLog": {"path": "/var/log/d.log", "allowSample": 0.5, "show": True}}
    from_file = parse_settings(doc, "settings.yaml").decision_log
    assert from_file is not None
    assert (from_file.path, from_file.allow_sample, from_file.show_values) == (
        "/var/log/d.log",
        0.5,
        True,
    )
    parser = argparse.ArgumentParser()
    add_arguments(parser, values_noun="values")
    merged = settings_from_args(
        parser.parse_args(["--decision-log-allow-sample", "0.1"]), from_file
    )
    assert (merged.path, merged.allow_sample, merged.show_values) == ("/var/log/d.log", 0.1, True)
    assert merged.salt == from_file.salt


def test_lines_go_to_the_configured_file(tmp_path: Path) -> None:
    target = tmp_path / "decisions.log"
    log = DecisionLog("filetest", DecisionLogSettings(path=str(target), salt=SALT))
    log.submit(lambda: {"decision_id": "built-in-the-writer"})
    log.close()
    (line,) = target.read_text().splitlines()
    assert json.loads(line)["decision_id"] == "built-in-the-writer"


def test_the_queue_is_bounded_in_bytes_too() -> None:
    stream = io.StringIO()
    settings = DecisionLogSettings(salt=SALT, queue_lines=100, queue_bytes=1000)
    log = DecisionLog("bytestest", settings, stream=stream)
    kept = [log.submit({"decision_id": "small"}, 400), log.submit({"decision_id": "big"}, 1001)]
    log.close()
    assert kept == [True, False]  # 1001 bytes could never fit in 1000, whatever is queued
    assert [json.loads(x)["decision_id"] for x in stream.getvalue().splitlines()] == ["small"]
    dropped = REGISTRY.get_sample_value(
        "bytestest_decision_log_dropped_total", {"cause": "queue_full"}
    )
    assert dropped == 1.0
