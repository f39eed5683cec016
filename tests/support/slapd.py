"""A throwaway OpenLDAP ``slapd`` for tests: own config, mdb in a temp dir, free port.

Debian's slapd is needed (``apt-get install -y slapd ldap-utils``; CI gets it
from ``scripts/setup``). The server runs in the foreground as a child of the
test process, listening only on 127.0.0.1, and is killed on ``stop()``.

It is configured with a classic ``slapd.conf`` (simpler than a cn=config
tree for a throwaway server) and has:

* the suffix ``dc=example,dc=test`` with ``ou=people`` and ``ou=groups``;
* a read-only service account ``cn=meshplane-sync,dc=example,dc=test``
  (password ``SYNC_PASSWORD``) that is subject to a server size limit of
  ``SIZE_LIMIT`` entries per search, so only a paged search can list more;
* the root DN (``ROOT_DN``/``ROOT_PASSWORD``) used by the tests to seed and
  change the directory through ldap3.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import ldap3  # type: ignore[import-untyped]

from tests.support.net import free_port, wait_for_port

SUFFIX = "dc=example,dc=test"
ROOT_DN = f"cn=admin,{SUFFIX}"
ROOT_PASSWORD = "root-password-for-tests-only"
SYNC_DN = f"cn=meshplane-sync,{SUFFIX}"
SYNC_PASSWORD = "sync-password-for-tests-only"
PEOPLE = f"ou=people,{SUFFIX}"
GROUPS = f"ou=groups,{SUFFIX}"
SIZE_LIMIT = 5
SETUP_HINT = (
    "slapd is not installed: run `DEBIAN_FRONTEND=noninteractive apt-get install -y slapd "
    "ldap-utils` (scripts/setup does this)"
)

_SCHEMA_DIR = Path("/etc/ldap/schema")
_MODULE_DIR = Path("/usr/lib/ldap")


def find_slapd() -> str:
    """The slapd binary, or an AssertionError naming the setup command."""
    for candidate in (shutil.which("slapd"), "/usr/sbin/slapd"):
        if candidate and Path(candidate).exists():
            return candidate
    raise AssertionError(SETUP_HINT)


def _config(workdir: Path) -> str:
    schemas = "\n".join(
        f"include {_SCHEMA_DIR / name}.schema"
        for name in ("core", "cosine", "inetorgperson", "nis")
    )
    return f"""{schemas}
pidfile {workdir}/slapd.pid
argsfile {workdir}/slapd.args
modulepath {_MODULE_DIR}
moduleload back_mdb

database mdb
maxsize 67108864
suffix "{SUFFIX}"
rootdn "{ROOT_DN}"
rootpw {ROOT_PASSWORD}
directory {workdir}/data
limits dn.exact="{SYNC_DN}" size.soft={SIZE_LIMIT} size.hard={SIZE_LIMIT} size.prtotal=unlimited
access to attrs=userPassword
  by anonymous auth
  by * none
access to *
  by dn.exact="{SYNC_DN}" read
  by * none
"""


@dataclass
class Slapd:
    port: int
    workdir: Path
    process: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"ldap://127.0.0.1:{self.port}"

    def admin(self) -> ldap3.Connection:
        """A bound root connection, for seeding and changing the directory."""
        conn = ldap3.Connection(
            ldap3.Server(self.url, get_info=ldap3.NONE),
            user=ROOT_DN,
            password=ROOT_PASSWORD,
            auto_bind=True,
            raise_exceptions=True,
        )
        return conn

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        shutil.rmtree(self.workdir, ignore_errors=True)


def start_slapd(
    *, tls: str = "", ldaps_port: int | None = None, workdir: Path | None = None
) -> Slapd:
    """Start a fresh, seeded-with-the-skeleton slapd; the caller must ``stop()`` it.

    ``tls`` holds TLS directives for the config (then ``ldap://`` also speaks
    StartTLS), and ``ldaps_port`` adds an ``ldaps://`` listener: what
    ``tests.identity.slapd_tls`` needs, on the one launcher.
    """
    binary = find_slapd()
    if not (_SCHEMA_DIR / "core.schema").exists():
        raise AssertionError(SETUP_HINT)
    workdir = workdir or Path(tempfile.mkdtemp(prefix="meshplane-slapd-"))
    (workdir / "data").mkdir(parents=True, exist_ok=True)
    conf = workdir / "slapd.conf"
    conf.write_text(_config(workdir).replace("database mdb", tls + "database mdb", 1))
    port = free_port()
    ports = [port] if ldaps_port is None else [port, ldaps_port]
    urls = f"ldap://127.0.0.1:{port}/"
    if ldaps_port is not None:
        urls += f" ldaps://127.0.0.1:{ldaps_port}/"
    with (workdir / "slapd.log").open("wb") as log:  # the child keeps its own descriptor
        process = subprocess.Popen(
            [binary, "-f", str(conf), "-h", urls, "-d", "0"],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    server = Slapd(port=port, workdir=workdir, process=process)
    try:
        deadline = time.monotonic() + 15
        while True:
            if process.poll() is not None:
                output = (workdir / "slapd.log").read_text(errors="replace")[-2000:]
                raise AssertionError(f"slapd exited with {process.returncode}:\n{output}")
            try:
                for listening in ports:
                    wait_for_port(listening, timeout=0.5)
                break
            except TimeoutError:
                if time.monotonic() > deadline:
                    raise
        _seed_skeleton(server)
    except BaseException:
        server.stop()
        raise
    return server


def _seed_skeleton(server: Slapd) -> None:
    conn = server.admin()
    try:
        conn.add(SUFFIX, ["dcObject", "organization"], {"o": "Example", "dc": "example"})
        conn.add(PEOPLE, ["organizationalUnit"], {"ou": "people"})
        conn.add(GROUPS, ["organizationalUnit"], {"ou": "groups"})
        conn.add(
            SYNC_DN,
            ["applicationProcess", "simpleSecurityObject"],
            {"cn": "meshplane-sync", "userPassword": SYNC_PASSWORD},
        )
    finally:
        conn.unbind()


def add_user(
    conn: ldap3.Connection, uid: str, *, mail: str | None = None, cn: str | None = None
) -> str:
    dn = f"uid={uid},{PEOPLE}"
    attributes = {"uid": uid, "cn": cn or uid.title(), "sn": uid.title()}
    if mail:
        attributes["mail"] = mail
    conn.add(dn, ["inetOrgPerson"], attributes)
    return dn


def add_group(
    conn: ldap3.Connection, cn: str, members: list[str], *, description: str | None = None
) -> str:
    """A groupOfNames; ``members`` are DNs (groupOfNames needs at least one)."""
    dn = f"cn={cn},{GROUPS}"
    attributes: dict[str, object] = {"cn": cn, "member": members}
    if description:
        attributes["description"] = description
    conn.add(dn, ["groupOfNames"], attributes)
    return dn
