"""Config hot reload: file edits, Kubernetes ConfigMap symlink swaps, and a bad
file on reload keeping the last good config (counted)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from tests.ratelimit.conftest import Harness, metric_value, request, serve_app, write_config

V1 = """\
domain: app
descriptors:
  - key: client
    rate_limit: {unit: minute, requests_per_unit: 5}
"""
V2 = V1.replace("requests_per_unit: 5", "requests_per_unit: 2")
BAD = V1.replace("unit: minute", "unit: fortnight")


async def limit_of(svc: Harness, domain: str = "app") -> int:
    resp = await svc.call(request(domain, [("client", "probe")]))
    return int(resp.statuses[0].current_limit.requests_per_unit)


async def wait_for_limit(svc: Harness, expected: int, domain: str = "app") -> None:
    async with asyncio.timeout(10):
        while await limit_of(svc, domain) != expected:
            await asyncio.sleep(0.05)


def configmap_swap(root: Path, version: str, text: str) -> None:
    """What the kubelet does: write a new hidden dir, then swap ``..data`` atomically."""
    target = root / f"..{version}"
    target.mkdir()
    (target / "app.yaml").write_text(text)
    tmp_link = root / "..data_tmp"
    tmp_link.symlink_to(target.name)
    os.replace(tmp_link, root / "..data")
    if not (root / "app.yaml").is_symlink():
        (root / "app.yaml").symlink_to("..data/app.yaml")


async def test_kubernetes_configmap_symlink_swap(tmp_path: Path) -> None:
    configmap_swap(tmp_path, "2026_11_22_01", V1)
    errors_before = metric_value(
        "meshplane_config_reloads_total", 'config="ratelimit",result="error"'
    )
    async with serve_app(tmp_path) as svc:
        assert await limit_of(svc) == 5
        configmap_swap(tmp_path, "2026_11_22_02", V2)
        await wait_for_limit(svc, 2)
        # A bad version: the last good config stays live and the error is counted.
        configmap_swap(tmp_path, "2026_11_22_03", BAD)
        async with asyncio.timeout(10):
            while (
                metric_value("meshplane_config_reloads_total", 'config="ratelimit",result="error"')
                == errors_before
            ):
                await asyncio.sleep(0.05)
        assert await limit_of(svc) == 2
        configmap_swap(tmp_path, "2026_11_22_04", V1)
        await wait_for_limit(svc, 5)


async def test_single_file_edit_and_new_domain(tmp_path: Path) -> None:
    path = write_config(tmp_path, "app.yaml", V1)
    async with serve_app(path) as svc:
        resp = await svc.call(request("other", [("client", "x")]))
        assert not resp.statuses[0].HasField("current_limit")  # unknown domain so far
        path.write_text(V2.replace("domain: app", "domain: other"))
        await wait_for_limit(svc, 2, domain="other")
        resp = await svc.call(request("app", [("client", "x")]))
        assert not resp.statuses[0].HasField("current_limit")  # app is gone
