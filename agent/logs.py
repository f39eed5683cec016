"""Reading a proxy's log file, following it across rotation (the I/O half of agent.logtail).

Polling, not inotify: a ``stat`` every :data:`POLL_SECONDS` per open
stream is cheap, works on every filesystem (including the network and
overlay ones VMs and containers use) and sees renames the same way as
writes. Reads happen in a worker thread so a slow disk never stalls the
tunnel.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Callable
from typing import BinaryIO

from agent.discovery import LogEntry, LogRequest, LogsUnavailable
from agent.logtail import Action, FileId, LineSplitter, SinceFilter, decide, last_lines, line_time

POLL_SECONDS = 0.05
READ_BYTES = 256 * 1024
# Without tailLines or sinceSeconds a stream starts with this many lines.
DEFAULT_TAIL_LINES = 100
# How far back from the end tailLines looks (bounds the read of a huge file).
TAIL_WINDOW_BYTES = 16 * 1024 * 1024


def _file_id(stat: os.stat_result) -> FileId:
    return FileId(stat.st_dev, stat.st_ino)


def _stat(path: str) -> os.stat_result | None:
    try:
        return os.stat(path)
    except FileNotFoundError:
        return None


def _open(path: str) -> tuple[BinaryIO, FileId] | None:
    try:
        handle = open(path, "rb")  # noqa: SIM115 - kept open while following
    except FileNotFoundError:
        return None
    return handle, _file_id(os.fstat(handle.fileno()))


def _tail_start(handle: BinaryIO, count: int) -> tuple[list[str], int]:
    size = os.fstat(handle.fileno()).st_size
    start = max(0, size - TAIL_WINDOW_BYTES)
    handle.seek(start)
    data = handle.read(size - start)
    lines, end = last_lines(data, count)
    return lines, start + end


async def follow_file(
    path: str,
    request: LogRequest,
    *,
    clock: Callable[[], float] = time.time,
    poll: float = POLL_SECONDS,
) -> AsyncIterator[LogEntry]:
    """The file's lines (the last ``tail_lines``, or those since ``since_seconds``),
    then, with ``follow``, every line written later, until cancelled."""
    opened = await asyncio.to_thread(_open, path)
    if opened is None and not request.follow:
        raise LogsUnavailable(f"log file {path} does not exist")
    since = SinceFilter(clock() - request.since_seconds if request.since_seconds else None)
    splitter = LineSplitter()
    handle: BinaryIO | None = None
    current: FileId | None = None
    offset = 0
    try:
        if opened is not None:
            handle, current = opened
            tail = request.tail_lines
            if tail is None and request.since_seconds is None:
                tail = DEFAULT_TAIL_LINES
            if tail is not None:
                lines, offset = await asyncio.to_thread(_tail_start, handle, tail)
                handle.seek(offset)
                for line in lines:
                    stamp = line_time(line)
                    if since.admit(stamp):
                        yield LogEntry(line, stamp)
        while True:
            if handle is not None:
                data = await asyncio.to_thread(handle.read, READ_BYTES)
                if data:
                    offset += len(data)
                    for line in splitter.feed(data):
                        stamp = line_time(line)
                        if since.admit(stamp):
                            yield LogEntry(line, stamp)
                    continue  # more may be waiting: read again before a stat
            if not request.follow:
                for line in splitter.flush():
                    yield LogEntry(line, line_time(line))
                return
            stat = await asyncio.to_thread(_stat, path)
            action = decide(
                current, offset, _file_id(stat) if stat else None, stat.st_size if stat else 0
            )
            if action is Action.REOPEN:
                # The open file was read to its end above; its partial last
                # line is complete now that the proxy writes elsewhere.
                for line in splitter.flush():
                    yield LogEntry(line, line_time(line))
                if handle is not None:
                    handle.close()
                opened = await asyncio.to_thread(_open, path)
                handle, current = opened if opened is not None else (None, None)
                offset = 0
                continue
            if action is Action.RESTART and handle is not None:
                handle.seek(0)
                offset = 0
                continue
            await asyncio.sleep(poll)
    finally:
        if handle is not None:
            handle.close()
