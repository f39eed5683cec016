"""``meshctl delete`` of an organization, a cluster or an object with children
asks for the name on a terminal and needs ``--yes`` without one.

Against the suite's real mgmt-api; the terminal is a real pseudo-terminal
(stdin, stdout and stderr of the meshctl process), read until the prompt
appears. What is left is checked over the REST API directly.
"""

from __future__ import annotations

import os
import pty
import select
import subprocess
import textwrap
import time
from pathlib import Path

from tests.meshctl.conftest import REPO, ManagementPlane, Meshctl, unique


def _tree(org: str) -> str:
    return textwrap.dedent(
        f"""\
        kind: Organization
        metadata: {{name: {org}}}
        ---
        kind: Tenant
        metadata: {{name: full, organization: {org}}}
        ---
        kind: Workspace
        metadata: {{name: w, organization: {org}, tenant: full}}
        spec: {{namespaceSelector: {{names: ["*/shop"]}}}}
        ---
        kind: Tenant
        metadata: {{name: empty, organization: {org}}}
        ---
        kind: Cluster
        metadata: {{name: c, organization: {org}}}
        """
    )


def _exists(mgmt: ManagementPlane, fqn: str) -> bool:
    with mgmt.admin() as http:
        status = http.get(f"/v2/{fqn}").status_code
    assert status in {200, 404}, status
    return status == 200


class Terminal:
    """meshctl with a pseudo-terminal as its stdin, stdout and stderr."""

    def __init__(self, ctl: Meshctl, *args: str) -> None:
        self._fd, child = pty.openpty()
        self.proc = subprocess.Popen(
            ctl.argv(*args),
            stdin=child,
            stdout=child,
            stderr=child,
            env=ctl.environ(),
            cwd=REPO,
        )
        os.close(child)
        self.text = ""

    def read_until(self, wanted: str, timeout: float = 60) -> str:
        """What the terminal showed, once ``wanted`` is in it (or the process ended)."""
        deadline = time.monotonic() + timeout
        while wanted not in self.text:
            assert time.monotonic() < deadline, f"never showed {wanted!r}: {self.text!r}"
            ready, _, _ = select.select([self._fd], [], [], 1)
            if not ready:
                continue
            try:
                chunk = os.read(self._fd, 4096)
            except OSError:  # EIO: every end of the terminal is closed (the process exited)
                break
            if not chunk:
                break
            self.text += chunk.decode(errors="replace")
        return self.text

    def type(self, line: str) -> None:
        os.write(self._fd, line.encode() + b"\n")

    def finish(self) -> int:
        self.read_until("\0")  # everything up to the end of the output
        code = self.proc.wait(timeout=60)
        os.close(self._fd)
        return code


def test_without_a_terminal_a_cluster_or_organization_delete_needs_yes(
    shared_admin: Meshctl, mgmt: ManagementPlane
) -> None:
    org = unique("confirm")
    shared_admin.ok("apply", "-f", "-", input=_tree(org))
    for args, fqn in [
        (("delete", "cluster", "c", "--org", org), f"organizations/{org}/clusters/c"),
        (("delete", "organization", org), f"organizations/{org}"),
        (("delete", f"organizations/{org}/tenants/full"), f"organizations/{org}/tenants/full"),
    ]:
        line = shared_admin.fails(2, *args)
        assert fqn in line and "--yes" in line and "nothing was deleted" in line, line
        assert _exists(mgmt, fqn)
    # Without children, a tenant goes unasked; with --yes, the rest.
    assert shared_admin.ok("delete", "tenant", "empty", "--org", org).strip() == (
        f"Tenant organizations/{org}/tenants/empty deleted"
    )
    shared_admin.ok("delete", "cluster", "c", "--org", org, "--yes")
    assert not _exists(mgmt, f"organizations/{org}/clusters/c")
    shared_admin.ok("delete", "organization", org, "-y")
    assert not _exists(mgmt, f"organizations/{org}")


def test_delete_by_file_asks_once_for_the_top_object_and_deletes_nothing_unconfirmed(
    shared_admin: Meshctl, mgmt: ManagementPlane, tmp_path: Path
) -> None:
    org = unique("confirm-f")
    manifest = tmp_path / "tree.yaml"
    manifest.write_text(_tree(org))
    shared_admin.ok("apply", "-f", str(manifest))
    line = shared_admin.fails(2, "delete", "-f", str(manifest))
    assert f"Organization organizations/{org} also" in line, line  # the top one only
    line = shared_admin.fails(2, "delete", "-f", "-", input=_tree(org))  # stdin is the file
    assert "--yes" in line
    assert _exists(mgmt, f"organizations/{org}/tenants/empty")
    shared_admin.ok("delete", "-f", str(manifest), "--yes")
    assert not _exists(mgmt, f"organizations/{org}")


def test_on_a_terminal_the_name_must_be_typed(shared_admin: Meshctl, mgmt: ManagementPlane) -> None:
    org = unique("confirm-tty")
    shared_admin.ok("apply", "-f", "-", input=_tree(org))
    cluster = f"organizations/{org}/clusters/c"

    wrong = Terminal(shared_admin, "delete", "cluster", "c", "--org", org)
    shown = wrong.read_until("to confirm")
    assert f"Cluster {cluster} and everything below it will be deleted." in shown
    assert "Type its name (c) to confirm" in shown
    wrong.type("demo")
    assert wrong.finish() == 2
    assert "the name was not typed; nothing was deleted" in wrong.text
    assert _exists(mgmt, cluster)

    right = Terminal(shared_admin, "delete", "cluster", "c", "--org", org)
    right.read_until("to confirm")
    right.type("c")
    assert right.finish() == 0, right.text
    assert f"Cluster {cluster} deleted" in right.text
    assert not _exists(mgmt, cluster)
    shared_admin.ok("delete", "organization", org, "--yes")
