"""The compiler's TypedDicts of stored JSON say what the API's models store.

The compiler reads stored specs as ``TypedDict``s (``envoy_config.GatewayKnobs``
and the sections under it, ``tracing.StoredTracing``, ``extauthz.StoredPolicy``)
while the API's pydantic models own the fields. A TypedDict cannot be derived
from a model, so this table holds each copy to its owner: a field added to or
renamed in a model fails here until the compiler's reading of it follows.
"""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from mgmt_api.compiler import envoy_config, extauthz, tracing
from mgmt_api.kinds import KINDS
from mgmt_api.schemas import resources
from mgmt_api.schemas.resources import Meta


def _aliases(model: type[BaseModel]) -> set[str]:
    return {field.alias or name for name, field in model.model_fields.items()}


@pytest.mark.parametrize(
    ("stored", "model"),
    [
        (envoy_config.StoredRateLimit, resources.ClusterRateLimit),
        (envoy_config.StoredRateLimitBackend, resources.RateLimitBackend),
        (envoy_config.StoredRedisBackend, resources.RedisBackend),
        (envoy_config.StoredSecretRef, resources.SecretRef),
        (envoy_config.StoredExtAuthz, resources.ClusterExtAuthz),
        (tracing.StoredTracing, resources.ClusterTracing),
    ],
    ids=lambda item: item.__name__,
)
def test_a_stored_section_has_its_models_fields(stored: type, model: type[BaseModel]) -> None:
    assert set(stored.__annotations__) == _aliases(model)


def test_a_stored_ext_authz_policy_has_its_kinds_fields_but_the_common_ones() -> None:
    fields = _aliases(KINDS["ExtAuthzPolicy"].model) - _aliases(Meta)
    assert set(extauthz.StoredPolicy.__annotations__) == fields


def test_the_gateway_knobs_are_cluster_fields() -> None:
    assert set(envoy_config.GATEWAY_SPEC_KEYS) <= _aliases(KINDS["Cluster"].model)
