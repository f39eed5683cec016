"""Following a log file: the pure decisions (agent.logtail) and the file follower on real files."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from agent.discovery import LogRequest
from agent.logs import follow_file
from agent.logtail import (
    Action,
    FileId,
    LineSplitter,
    SinceFilter,
    decide,
    last_lines,
    line_time,
    rfc3339_seconds,
)

A, B = FileId(1, 10), FileId(1, 11)


@pytest.mark.parametrize(
    ("opened", "offset", "at_path", "size", "action"),
    [
        (A, 100, A, 100, Action.READ),
        (A, 100, A, 150, Action.READ),
        (A, 100, A, 20, Action.RESTART),  # copy-and-truncate
        (A, 100, B, 0, Action.REOPEN),  # renamed, a new file at the path
        (A, 100, None, 0, Action.READ),  # removed: finish the open file
        (None, 0, None, 0, Action.WAIT),
        (None, 0, A, 10, Action.REOPEN),  # appeared
    ],
)
def test_decide(
    opened: FileId | None, offset: int, at_path: FileId | None, size: int, action: Action
) -> None:
    assert decide(opened, offset, at_path, size) is action


def test_splitter_keeps_partial_lines() -> None:
    splitter = LineSplitter(max_line=8)
    assert splitter.feed(b"one\ntw") == ["one"]
    assert splitter.feed(b"o\r\nthree") == ["two"]
    assert splitter.flush() == ["three"]
    assert splitter.feed(b"0123456789") == ["01234567"]  # an endless line is cut


@pytest.mark.parametrize(
    ("data", "count", "lines", "end"),
    [
        (b"a\nb\nc\n", 2, ["b", "c"], 6),
        (b"a\nb\nc\npart", 5, ["a", "b", "c"], 6),
        (b"a\nb\n", 0, [], 4),
        (b"no newline", 3, [], 0),
    ],
)
def test_last_lines(data: bytes, count: int, lines: list[str], end: int) -> None:
    assert last_lines(data, count) == (lines, end)


def test_line_times() -> None:
    local = time.mktime(time.strptime("2026-11-25 12:14:49", "%Y-%m-%d %H:%M:%S"))
    assert line_time("[2026-11-25 12:14:49.673][1][info] x") == pytest.approx(local + 0.673)
    assert line_time("2026-11-25T12:14:49.5Z x") == rfc3339_seconds("2026-11-25T12:14:49.5Z")
    assert rfc3339_seconds("1970-01-01T00:00:01.123456789Z") == pytest.approx(1.123456)
    assert line_time("  continuation") is None


def test_since_filter_keeps_continuations_with_their_entry() -> None:
    since = SinceFilter(cutoff=100.0)
    assert [since.admit(t) for t in (50.0, None, 150.0, None, 90.0)] == [
        False,
        False,
        True,
        True,
        False,
    ]
    assert SinceFilter(None).admit(None)


async def _collect(path: Path, request: LogRequest, count: int, act: object = None) -> list[str]:
    out: list[str] = []
    stream = follow_file(str(path), request, poll=0.01)
    async with asyncio.timeout(20):
        async for entry in stream:
            out.append(entry.line)
            if callable(act):
                act(entry.line)
            if len(out) == count:
                break
    await stream.aclose()  # type: ignore[attr-defined]
    return out


async def test_follow_survives_rename_and_truncate(tmp_path: Path) -> None:
    log = tmp_path / "envoy.log"
    log.write_text("old-1\nold-2\n")

    def act(line: str) -> None:
        if line == "old-2":  # written after the stream started
            with log.open("a") as f:
                f.write("new-1\n")
        elif line == "new-1":  # rotate: rename and a new file
            log.rename(tmp_path / "envoy.log.1")
            log.write_text("rotated-1\n")
        elif line == "rotated-1":  # copy-and-truncate
            with log.open("r+") as f:
                f.truncate(0)
            with log.open("a") as f:
                f.write("t\n")

    lines = await _collect(log, LogRequest(follow=True, tail_lines=1, since_seconds=None), 4, act)
    assert lines == ["old-2", "new-1", "rotated-1", "t"]


async def test_no_follow_reads_and_ends(tmp_path: Path) -> None:
    log = tmp_path / "envoy.log"
    now = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())
    log.write_text(f"[2000-01-01 00:00:00.000] ancient\n  more\n[{now}.000] recent\n  detail\n")
    request = LogRequest(follow=False, tail_lines=None, since_seconds=60)
    lines = [e.line async for e in follow_file(str(log), request)]
    assert lines == [f"[{now}.000] recent", "  detail"]
    os.remove(log)
