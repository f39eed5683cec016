"""Following a proxy's log file: the decisions, without the I/O.

A log file is followed by name, as ``tail -F`` does, so rotation is survived
whichever way it is done:

- *rename and reopen* (logrotate's default, Envoy's ``/reopen_logs``): the
  path now names another file. The rest of the old file is read first (the
  proxy may have written to it until it reopened), then the new one from
  its start;
- *copy and truncate*: the same file became shorter than what was read; it
  is read again from its start;
- *removed*: nothing to read until the path exists again.

Also here: splitting bytes into lines across reads, the last N lines of a
buffer, the time a line carries, and the ``since`` filter. The adapter is
:mod:`agent.logs`. Pure; table-tested in ``tests/agent/test_logtail.py``.
"""

from __future__ import annotations

import calendar
import datetime as dt
import enum
import re
import time
from dataclasses import dataclass, field


@dataclass(frozen=True)
class FileId:
    """A file, as opposed to a path: (device, inode)."""

    device: int
    inode: int


class Action(enum.Enum):
    READ = "read"  # keep reading the open file
    REOPEN = "reopen"  # drain the open file, then open the path from its start
    RESTART = "restart"  # truncated: read the open file again from its start
    WAIT = "wait"  # nothing open and nothing at the path


def decide(opened: FileId | None, offset: int, at_path: FileId | None, size: int) -> Action:
    """What to do after a stat of the path (``at_path``/``size``) while ``opened`` is read
    up to ``offset``."""
    if at_path is None:
        return Action.READ if opened is not None else Action.WAIT
    if opened is None or at_path != opened:
        return Action.REOPEN
    if size < offset:
        return Action.RESTART
    return Action.READ


@dataclass
class LineSplitter:
    """Bytes in, complete lines out; a partial last line waits for its end."""

    max_line: int = 64 * 1024
    _pending: bytearray = field(default_factory=bytearray)

    def feed(self, data: bytes) -> list[str]:
        self._pending += data
        lines: list[str] = []
        while True:
            end = self._pending.find(b"\n")
            if end < 0:
                break
            lines.append(self._decode(self._pending[:end]))
            del self._pending[: end + 1]
        if len(self._pending) > self.max_line:  # a line without end: cut it
            lines.append(self._decode(self._pending[: self.max_line]))
            del self._pending[: self.max_line]
        return lines

    def flush(self) -> list[str]:
        """The partial line, when the file it came from is done with."""
        if not self._pending:
            return []
        line = self._decode(self._pending)
        self._pending.clear()
        return [line]

    @staticmethod
    def _decode(raw: bytes | bytearray) -> str:
        return bytes(raw).rstrip(b"\r").decode("utf-8", errors="replace")


def last_lines(data: bytes, count: int) -> tuple[list[str], int]:
    """The last ``count`` complete lines of ``data``, and the offset just past them.

    A trailing partial line is not counted (it is still being written): it
    lies after the offset returned, so the caller reads it as new data.
    """
    end = data.rfind(b"\n") + 1
    if count <= 0 or end == 0:
        return [], end
    begin = end - 1  # the newline ending the last line
    for _ in range(count):
        begin = data.rfind(b"\n", 0, begin)
        if begin < 0:
            break
    lines = data[begin + 1 : end].decode("utf-8", errors="replace").split("\n")[:-1]
    return lines, end


_ENVOY_TIME = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?)\]")
_RFC3339 = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:\d\d))")


def line_time(line: str) -> float | None:
    """The time at the start of a line: Envoy's ``[YYYY-mm-dd HH:MM:SS.fff]`` (local time,
    as Envoy writes it) or an RFC 3339 stamp; None when the line carries none."""
    match = _ENVOY_TIME.match(line)
    if match:
        try:
            parsed = dt.datetime.strptime(match.group(1)[:26], "%Y-%m-%d %H:%M:%S.%f")
        except ValueError:
            try:
                parsed = dt.datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S")
            except ValueError:
                return None
        return time.mktime(parsed.timetuple()) + parsed.microsecond / 1e6
    match = _RFC3339.match(line)
    if match:
        return rfc3339_seconds(match.group(1))
    return None


def rfc3339_seconds(text: str) -> float | None:
    """Seconds since the epoch of an RFC 3339 time (nanoseconds cut to microseconds)."""
    stamp = text.replace("Z", "+00:00")
    head, dot, rest = stamp.partition(".")
    if dot:
        digits = re.match(r"\d+", rest)
        if digits is None:
            return None
        stamp = f"{head}.{digits.group(0)[:6]}{rest[len(digits.group(0)) :]}"
    try:
        parsed = dt.datetime.fromisoformat(stamp)
    except ValueError:
        return None
    return calendar.timegm(parsed.utctimetuple()) + parsed.microsecond / 1e6


def rfc3339(seconds: float) -> str:
    return (
        dt.datetime.fromtimestamp(seconds, tz=dt.UTC)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z")
    )


@dataclass
class SinceFilter:
    """Lines at or after ``cutoff``; a line without a time goes with the line before it
    (the continuation of a multi-line entry). ``cutoff`` None lets everything through."""

    cutoff: float | None
    _passing: bool = False

    def admit(self, stamp: float | None) -> bool:
        if self.cutoff is None:
            return True
        if stamp is not None:
            self._passing = stamp >= self.cutoff
        return self._passing
