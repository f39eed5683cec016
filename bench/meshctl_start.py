"""How fast meshctl answers: time to first output of ``meshctl --version`` and
``meshctl get organizations`` against a local mgmt-api.

    uv run python bench/meshctl_start.py [--runs 15] [--importtime]

Starts ``mgmt-api serve`` (SQLite, loopback; ``tests/mgmt_api/harness.py``),
logs meshctl in with a home of its own, then runs each command ``--runs``
times as a user runs it (the ``meshctl`` console script of this environment)
and measures from the spawn to the first byte on stdout. Bytecode caching is
on for the runs (an installed package has its ``.pyc`` files; a first,
untimed run writes them), so the figure is the interpreter's start plus the
imports the command makes, plus the request. Prints the minimum and the
median of each; the target is under 0.3 s on an idle machine, and the load
average is printed with the figures. ``--importtime`` also prints the ten
slowest imports (cumulative) of one ``meshctl get``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.h2grpc import load_note  # noqa: E402
from tests.mgmt_api.harness import ADMIN_PASSWORD, MgmtServer  # noqa: E402

TARGET_S = 0.3


def meshctl_argv() -> list[str]:
    """The console script next to this interpreter, else ``python -m meshctl``."""
    script = Path(sys.executable).with_name("meshctl")
    return [str(script)] if script.exists() else [sys.executable, "-m", "meshctl"]


def environ(home: Path, server: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MESHCTL_")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # as installed: .pyc files are used
    env.update(
        {"HOME": str(home), "XDG_CONFIG_HOME": str(home / "config"), "MESHCTL_SERVER": server}
    )
    return env


def first_output(argv: list[str], env: dict[str, str]) -> float:
    """Seconds from the spawn to the first byte on stdout; the command must exit 0."""
    started = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    first = proc.stdout.read(1)
    elapsed = time.perf_counter() - started
    _, err = proc.communicate()
    if proc.returncode != 0 or not first:
        raise RuntimeError(f"{argv} failed ({proc.returncode}): {err.decode()[-2000:]}")
    return elapsed


def measure(name: str, argv: list[str], env: dict[str, str], runs: int) -> None:
    first_output(argv, env)  # untimed: writes the bytecode caches
    times = [first_output(argv, env) for _ in range(runs)]
    best, median = min(times), statistics.median(times)
    verdict = "under" if best < TARGET_S else "OVER"
    print(f"{name:<28} min {best:.3f} s  median {median:.3f} s  ({verdict} {TARGET_S} s)")


def slowest_imports(argv: list[str], env: dict[str, str], count: int = 10) -> None:
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "meshctl", *argv[1:]],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    rows = []
    for line in done.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            _, cumulative, module = line.split("|")
            if cumulative.strip().isdigit():
                rows.append((int(cumulative), module.rstrip()))
    print(f"slowest imports of meshctl {' '.join(argv[1:])} (cumulative, µs):")
    for micros, module in sorted(rows, reverse=True)[:count]:
        print(f"  {micros:>8}  {module}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--importtime", action="store_true")
    args = parser.parse_args()
    server = MgmtServer().start()
    try:
        with tempfile.TemporaryDirectory(prefix="meshctl-bench-") as home:
            env = environ(Path(home), server.url)
            base = meshctl_argv()
            subprocess.run(
                [*base, "login", "--username", "admin", "--password-stdin"],
                input=ADMIN_PASSWORD.encode(),
                env=env,
                check=True,
                capture_output=True,
            )
            measure("meshctl --version", [*base, "--version"], env, args.runs)
            get = [*base, "get", "organizations"]
            measure("meshctl get organizations", get, env, args.runs)
            if args.importtime:
                slowest_imports(["meshctl", "get", "organizations"], env)
    finally:
        server.close()
    print(load_note())


if __name__ == "__main__":
    main()
