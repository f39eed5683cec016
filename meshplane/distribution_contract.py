"""The policy-distribution contract shared by the stream's two ends.

The wire format is ``protos/meshplane/proto/distribution/v1``; this module
holds what both the subscriber (:mod:`meshplane.distribution_client`, in
every ratelimit and extauthz instance) and the server (``mgmt_api.distribution``)
must agree on beyond the protobuf messages, so neither imports the other.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshplane.proto.distribution.v1 import distribution_pb2

#: ``aud`` of the tokens a subscriber opens its stream with. The management
#: plane requires it on the stream and refuses it on REST, so a stolen stream
#: token cannot call the API and a REST token cannot open a stream.
TOKEN_AUDIENCE = "meshplane:policy-distribution"  # noqa: S105 - an audience

#: The service kinds that subscribe, each receiving its own snapshot.
SERVICE_KINDS: tuple[str, ...] = ("ratelimit", "extauthz")


@dataclass(frozen=True)
class NodeIdentity:
    """Who subscribes: the service kind, its cluster and this instance."""

    kind: str
    organization: str
    cluster: str
    instance: str

    def to_proto(self) -> distribution_pb2.Node:
        return distribution_pb2.Node(
            kind=self.kind,
            organization=self.organization,
            cluster=self.cluster,
            instance=self.instance,
        )
