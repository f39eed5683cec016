"""What the compiler builds: Envoy resources as protojson documents.

One alias for every module of the compiler, and for the distribution layer that
packs the documents into protobuf ``Any`` messages. Their shape is Envoy's
(``envoy.config.*.v3`` in JSON form, camelCase keys), checked by packing them
with the official protos (``xds-protos``), not by a Python type.
"""

from typing import Any

JsonDict = dict[str, Any]
