"""Config loading: the reference's format, its validation errors located by file,
line and field, and directories of files."""

from __future__ import annotations

from pathlib import Path

import pytest

from meshplane.config_error import ConfigError
from ratelimit.config import load_config
from tests.ratelimit.conftest import write_config

GOOD = """\
domain: rl
descriptors:
  - key: foo
    value: pelle
    rate_limit: {unit: minute, requests_per_unit: 3, name: pelle_limit}
  - key: baz
    rate_limit:
      unit: SECOND
      requests_per_unit: 5
    shadow_mode: true
  - key: files
    value: "files/*"
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: unl
    rate_limit: {unlimited: true}
  - key: allow
    value: listed
  - key: week
    detailed_metric: true
    quota_mode: true
    metadata: {service: {name: weekly}, tags: [a, 1, true, null, 2.5]}
    rate_limit: {unit: week, requests_per_unit: 1}
  - key: thirty
    rate_limit: {unit: second, unit_multiplier: 30, requests_per_unit: 5}
  - key: five_min
    rate_limit: {unit: minute, unit_multiplier: 5, requests_per_unit: 5}
  - key: one
    rate_limit: {unit: hour, unit_multiplier: null, requests_per_unit: 5}
  - key: slide
    rate_limit: {unit: minute, requests_per_unit: 5, algorithm: sliding_window}
  - key: fixed
    rate_limit: {unit: minute, requests_per_unit: 5, algorithm: fixed_window}
"""


def test_loads_the_reference_format(tmp_path: Path) -> None:
    config = load_config(write_config(tmp_path, "rl.yaml", GOOD))
    root = config.domains["rl"].root
    pelle = root.exact[("foo", "pelle")].limit
    assert pelle is not None
    assert (pelle.requests_per_unit, pelle.unit, pelle.window_seconds, pelle.name) == (
        3,
        "MINUTE",
        60,
        "pelle_limit",
    )
    baz = root.defaults["baz"].limit
    assert baz is not None and baz.shadow_mode and baz.rule_id == "baz"
    files = root.wildcards["files"][0]
    assert files.share_threshold and files.limit is not None
    assert files.limit.rule_id == "files_files/*"
    unl = root.defaults["unl"].limit
    assert unl is not None and unl.unlimited
    assert root.exact[("allow", "listed")].limit is None
    week = root.defaults["week"].limit
    assert week is not None and week.window_seconds == 604800
    # The reference's per-descriptor flags and metadata are kept on the limit.
    assert (week.quota_mode, week.detailed_metric) == (True, True)
    assert week.metadata == {"service": {"name": "weekly"}, "tags": ["a", 1, True, None, 2.5]}
    assert (pelle.quota_mode, pelle.detailed_metric, pelle.metadata) == (False, False, None)
    # unit_multiplier: the window is that many units; absent or null, one.
    windows = {k: root.defaults[k].limit for k in ("thirty", "five_min", "one")}
    assert {k: (v.unit, v.window_seconds) for k, v in windows.items() if v} == {
        "thirty": ("SECOND", 30),
        "five_min": ("MINUTE", 300),
        "one": ("HOUR", 3600),
    }
    # algorithm: fixed_window unless sliding_window is asked for.
    sliding = {k: root.defaults[k].limit for k in ("slide", "fixed", "one")}
    assert {k: v.sliding for k, v in sliding.items() if v} == {
        "slide": True,
        "fixed": False,
        "one": False,
    }


@pytest.mark.parametrize(
    ("text", "line", "field", "message"),
    [
        ("descriptors: []\n", None, "domain", "config file cannot have empty domain"),
        (
            "domain: d\ndescriptors:\n  - value: x\n",
            3,
            "descriptors[0].key",
            "descriptor has empty key",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: fortnight, "
            "requests_per_unit: 1}\n",
            4,
            "descriptors[0].rate_limit.unit",
            "invalid rate limit unit 'fortnight'",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    ratelimit: {}\n",
            4,
            "descriptors[0].ratelimit",
            "unknown key 'ratelimit'",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    value: b\n  - key: a\n    value: b\n",
            5,
            "descriptors[1]",
            "duplicate descriptor composite key 'd.a_b'",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unlimited: true\n"
            "      unit: second\n",
            6,
            "descriptors[0].rate_limit.unit",
            "should not specify rate limit unit when unlimited",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      name: n\n"
            "      unit: second\n      requests_per_unit: 1\n      replaces: [{name: n}]\n",
            8,
            "descriptors[0].rate_limit.replaces[0].name",
            "replaces should not contain name of same descriptor",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n"
            "      requests_per_unit: 1\n      replaces: [{}]\n",
            7,
            "descriptors[0].rate_limit.replaces[0].name",
            "should not have an empty replaces entry",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    value: b\n    share_threshold: true\n",
            5,
            "descriptors[0].share_threshold",
            "share_threshold can only be used with wildcard values",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, "
            "requests_per_unit: -1}\n",
            4,
            "descriptors[0].rate_limit.requests_per_unit",
            "must be an integer",
        ),
        (
            "domain: d\ndescriptors:\n  - just-a-string\n",
            3,
            "descriptors[0]",
            "list of type other than map",
        ),
        ("domain: d\ndescriptors:\n  - key: [a]\n", 3, "descriptors[0].key", "must be a string"),
        (
            "domain: d\ndescriptors:\n  - key: a\n    metadata: {when: 2026-01-01}\n",
            4,
            "descriptors[0].metadata",
            "holds date values; only JSON-like values are allowed",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: day, "
            "requests_per_unit: 1, unit_multiplier: 366}\n",
            4,
            "descriptors[0].rate_limit.unit_multiplier",
            "a window of 366 days is longer than 365 days; at most 365 are allowed",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, "
            "requests_per_unit: 1, unit_multiplier: 0}\n",
            4,
            "descriptors[0].rate_limit.unit_multiplier",
            "must be an integer from 1 to 31536000, got 0",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: minute, "
            "requests_per_unit: 1, unit_multiplier: '5'}\n",
            4,
            "descriptors[0].rate_limit.unit_multiplier",
            "must be an integer from 1 to 525600",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unlimited: true, "
            "unit_multiplier: 2}\n",
            4,
            "descriptors[0].rate_limit.unit_multiplier",
            "should not specify unit_multiplier when unlimited",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: minute, "
            "requests_per_unit: 1, algorithm: leaky_bucket}\n",
            4,
            "descriptors[0].rate_limit.algorithm",
            "must be fixed_window or sliding_window, got 'leaky_bucket'",
        ),
        ("domain: d\ndescriptors: [\n", None, None, "invalid YAML"),
    ],
)
def test_errors_name_file_line_and_field(
    tmp_path: Path, text: str, line: int | None, field: str | None, message: str
) -> None:
    path = write_config(tmp_path, "bad.yaml", text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    err = info.value
    assert err.source == str(path)
    assert message in err.message
    if line is not None:
        assert err.line == line
    if field is not None:
        assert err.field == field
    assert str(err).startswith(f"{path}:")


def test_directory_loads_every_visible_yaml_and_rejects_duplicate_domains(tmp_path: Path) -> None:
    write_config(tmp_path, "a.yaml", "domain: a\ndescriptors: [{key: k}]\n")
    write_config(tmp_path, "b.yml", "domain: b\ndescriptors: [{key: k}]\n")
    write_config(tmp_path, "notes.txt", "not yaml: [")
    hidden = tmp_path / "..data"
    hidden.mkdir()
    write_config(hidden, "c.yaml", "domain: a\n")
    write_config(tmp_path, ".hidden.yaml", "domain: a\n")
    assert sorted(load_config(tmp_path).domains) == ["a", "b"]
    write_config(tmp_path, "c.yaml", "domain: a\ndescriptors: []\n")
    with pytest.raises(ConfigError, match="duplicate domain 'a'"):
        load_config(tmp_path)


def test_missing_path_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        load_config(tmp_path / "absent.yaml")
