"""Open a gRPC stream with a credential and say whether it was admitted.

The admission tests (which credential opens which stream) ask one question of
every stream: does its first answer come, or a refusal? :func:`first_answer`
sends one message, holds the stream open until the answer (or the refusal)
arrives, then cancels it, so no test leaves a stream behind.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import grpc


class Held:
    """A request iterator that sends ``first`` and then holds the stream open."""

    def __init__(self, first: Any) -> None:
        self.first = first
        self.done = threading.Event()

    def __iter__(self) -> Iterator[Any]:
        yield self.first
        self.done.wait(30)


def first_answer(open_stream: Callable[[Held], Any], first: Any) -> grpc.StatusCode | None:
    """Open a stream, wait for its first message; None if one came, else the code."""
    held = Held(first)
    call = open_stream(held)
    try:
        next(call)
    except grpc.RpcError as exc:
        return exc.code()
    finally:
        call.cancel()
        held.done.set()
    return None
