"""``mgmt-api serve`` with a stack sampler, for profiling the mesh scale bench.

    python bench/mesh/sampled_serve.py OUT serve ARGS...

Samples the event loop thread's stack every 5 ms (``sys._current_frames``, in a
thread of this process: no ptrace needed). SIGUSR1 clears the samples (start
of a window), SIGUSR2 writes them to OUT (``OUT.self`` and ``OUT.total``:
the functions by samples where they ran, and by samples under them).
"""

from __future__ import annotations

import collections
import signal
import sys
import threading
import time
from types import FrameType

INTERVAL = 0.005


class Sampler:
    def __init__(self, out: str, target: int) -> None:
        self.out, self.target = out, target
        self.own: collections.Counter[str] = collections.Counter()
        self.under: collections.Counter[str] = collections.Counter()
        self.samples = 0

    def run(self) -> None:
        while True:
            time.sleep(INTERVAL)
            frame: FrameType | None = sys._current_frames().get(self.target)
            if frame is None:
                continue
            self.samples += 1
            seen = set()
            first = True
            while frame is not None:
                code = frame.f_code
                name = f"{code.co_filename.rpartition('/')[2]}:{code.co_firstlineno}:{code.co_name}"
                if first:
                    self.own[name] += 1
                    first = False
                if name not in seen:
                    self.under[name] += 1
                    seen.add(name)
                frame = frame.f_back

    def clear(self, *_: object) -> None:
        self.own.clear()
        self.under.clear()
        self.samples = 0

    def dump(self, *_: object) -> None:
        for suffix, counts in (("self", self.own), ("total", self.under)):
            with open(f"{self.out}.{suffix}", "w") as f:
                f.write(f"samples {self.samples}\n")
                for name, count in counts.most_common(80):
                    f.write(f"{count:7d} {100 * count / max(1, self.samples):5.1f}% {name}\n")


def main() -> None:
    out = sys.argv[1]
    sampler = Sampler(out, threading.main_thread().ident or 0)
    signal.signal(signal.SIGUSR1, sampler.clear)
    signal.signal(signal.SIGUSR2, sampler.dump)
    threading.Thread(target=sampler.run, daemon=True).start()
    sys.argv = ["mgmt-api", *sys.argv[2:]]
    from mgmt_api.cli import main as cli  # noqa: PLC0415 - after the sampler starts

    cli()


if __name__ == "__main__":
    main()
