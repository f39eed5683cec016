"""``scripts/run --port-base N``: every port moves together, by its fixed offset.

The parser and the port resolution are the orchestrator's own (in process);
the README's table of offsets is checked against :data:`PORT_OFFSETS`, and a
busy port under a base is named with its flag before anything starts. The
whole stack on a port base is started by tests/e2e/test_run_command.py.
"""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from demo.stack import (
    MAX_PORT_BASE,
    PORT_OFFSETS,
    PORT_ROLES,
    Ports,
    _parser,
    port_flag,
    resolve_ports,
)

README = Path(__file__).resolve().parents[2] / "README.md"
#: The port with the highest offset: a base's last port.
_LAST = max(PORT_OFFSETS, key=PORT_OFFSETS.__getitem__)


def resolved(*argv: str) -> Ports:
    args = _parser().parse_args(list(argv))
    return resolve_ports(args.host, args.port_base, {k: getattr(args, k) for k in PORT_ROLES})


def test_offsets_are_fixed_distinct_and_cover_every_port() -> None:
    assert set(PORT_OFFSETS) == set(PORT_ROLES)
    assert sorted(PORT_OFFSETS.values()) == list(range(len(PORT_ROLES)))
    assert MAX_PORT_BASE + max(PORT_OFFSETS.values()) == 65535


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        ((), {"mgmt": 8080, "grpc": 8444, "gateway": 10000, "payments_outbound": 15101}),
        (
            ("--port-base", "20000"),
            {
                "mgmt": 20000,
                "grpc": 20001,
                "payments_outbound": 20000 + PORT_OFFSETS["payments_outbound"],
            },
        ),
        # A port's own flag wins over the base, whatever the order on the line.
        (("--mgmt-port", "9999", "--port-base", "20000"), {"mgmt": 9999, "grpc": 20001}),
        (("--port-base", str(MAX_PORT_BASE)), {_LAST: 65535}),
        (("--gateway-port", "10500"), {"gateway": 10500, "mgmt": 8080}),
    ],
)
def test_each_port_is_its_flag_else_base_plus_offset_else_default(
    argv: tuple[str, ...], expected: dict[str, int]
) -> None:
    ports = resolved(*argv)
    assert {name: getattr(ports, name) for name in expected} == expected
    if "--port-base" in argv and len(argv) == 2:
        base = int(argv[1])
        assert all(getattr(ports, n) == base + off for n, off in PORT_OFFSETS.items())


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ("--port-base", "x"),
            f"argument --port-base: want an integer from 1 to {MAX_PORT_BASE}, got 'x'",
        ),
        (("--port-base", "0"), f"argument --port-base: want an integer from 1 to {MAX_PORT_BASE}"),
        (
            ("--port-base", str(MAX_PORT_BASE + 1)),
            f"argument --port-base: want an integer from 1 to {MAX_PORT_BASE} (its last port is"
            f" N+{PORT_OFFSETS[_LAST]}), got {MAX_PORT_BASE + 1}",
        ),
        (("--port-base", "1.5"), "argument --port-base: want an integer"),
        (("--mgmt-port", "70000"), "argument --mgmt-port: want an integer from 1 to 65535"),
    ],
)
def test_a_bad_value_is_refused_naming_the_flag(
    argv: tuple[str, ...], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        _parser().parse_args(list(argv))
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_the_readme_table_is_the_offsets() -> None:
    """Every row of the README's port table: its flag, default and offset are the code's."""
    rows = re.findall(r"^\| `(--[\w-]+-port)` \| (\d+) \| \+(\d+) \|", README.read_text(), re.M)
    defaults = Ports()
    assert {flag: (int(d), int(o)) for flag, d, o in rows} == {
        port_flag(name): (getattr(defaults, name), offset) for name, offset in PORT_OFFSETS.items()
    }


def test_a_busy_port_under_a_base_is_named_with_its_flag(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        busy = holder.getsockname()[1]
        base = busy - PORT_OFFSETS["gateway"]
        if base < 1 or base > MAX_PORT_BASE:
            pytest.skip("the kernel's free port leaves no room for a base")
        argv = [sys.executable, "-m", "demo", "--state-dir", str(tmp_path / ".run")]
        done = subprocess.run(
            [*argv, "--port-base", str(base)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert done.returncode == 1, done
    assert f"port {busy} (gateway listener) on 127.0.0.1 is in use: pass --gateway-port N" in (
        done.stderr
    )
    assert "--port-base N)" not in done.stderr  # the hint is for those who did not use it
    assert not (tmp_path / ".run").exists()
