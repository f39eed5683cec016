"""A throwaway PostgreSQL server for tests and benches.

It runs ``initdb`` and ``postgres`` from the machine's PostgreSQL binaries in
a temporary directory, on a free loopback port with its unix socket in that
directory, so it never touches a PostgreSQL the machine may already run.
PostgreSQL refuses to run as root; as root we run it as the ``postgres`` OS
user through ``runuser``. ``find_bin_dir()`` returning None is the only
reason to skip.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

from tests.support.net import free_port, wait_for_port
from tests.support.processes import terminate


def find_bin_dir() -> Path | None:
    found = shutil.which("pg_ctl") or shutil.which("initdb")
    if found:
        return Path(found).parent
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), reverse=True)
    return Path(candidates[0]).parent if candidates else None


class PostgresServer:
    """Start with ``start()``, stop with ``stop()``; ``new_database()`` gives a URL."""

    def __init__(self, bin_dir: Path) -> None:
        self.bin_dir = bin_dir
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="meshplane-pg-"))
        self.data = self.root / "data"
        self._proc: subprocess.Popen[bytes] | None = None
        self._as_other_user = os.geteuid() == 0
        self.user = "postgres"

    def _cmd(self, *args: str) -> list[str]:
        if self._as_other_user:
            return ["runuser", "-u", "postgres", "--", *args]
        return list(args)

    def start(self) -> PostgresServer:
        if self._as_other_user:
            pw = pwd.getpwnam("postgres")
            os.chown(self.root, pw.pw_uid, pw.pw_gid)
        subprocess.run(
            self._cmd(
                str(self.bin_dir / "initdb"),
                "-D",
                str(self.data),
                "-A",
                "trust",
                "-U",
                self.user,
                "-E",
                "UTF8",
                "--no-sync",
            ),
            check=True,
            capture_output=True,
        )
        self._proc = subprocess.Popen(
            self._cmd(
                str(self.bin_dir / "postgres"),
                "-D",
                str(self.data),
                "-p",
                str(self.port),
                "-k",
                str(self.root),
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                "fsync=off",
                "-c",
                "synchronous_commit=on",
                "-c",
                "full_page_writes=off",
                "-c",
                "max_connections=200",
                "-c",
                "shared_buffers=64MB",
            ),
            stdout=subprocess.DEVNULL,
            stderr=open(self.root / "postgres.log", "wb"),  # noqa: SIM115 - lives as long as the server
        )
        wait_for_port(self.port, timeout=30)
        # Accepting TCP is not yet accepting logins: wait for a query to work.
        deadline = time.monotonic() + 30
        while True:
            try:
                self._exec("SELECT 1")
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        return self

    def _exec(self, sql: str) -> None:
        import psycopg

        with psycopg.connect(
            host="127.0.0.1", port=self.port, user=self.user, dbname="postgres", autocommit=True
        ) as conn:
            conn.execute(sql)

    def new_database(self) -> str:
        name = "mp_" + uuid.uuid4().hex[:12]
        self._exec(f"CREATE DATABASE {name}")
        return f"postgresql+psycopg://{self.user}@127.0.0.1:{self.port}/{name}"

    def stop(self) -> None:
        if self._proc is not None:
            terminate(self._proc, grace=20)
            self._proc = None
        shutil.rmtree(self.root, ignore_errors=True)
