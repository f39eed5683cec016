"""Which of a cluster's credentials may open what: the one table.

A cluster has one service account per component that talks to mgmt-api,
``.../clusters/{cluster}/serviceaccounts/{agent,gateway,extauthz,ratelimit}``,
all created with the cluster (and by the install template on a cluster that
predates some of them); the install template mints a key of each. A token
signed with an account's key is admitted on the channels of its row in
:data:`ACCOUNTS` and nowhere else, so a stolen gateway credential reads its
cluster's gateway config but no policy with secrets, and the agent's reports
inventory and serves diagnostics but subscribes to nothing.

None of these accounts holds a role: REST refuses their writes like any
principal without one. The agent's report over REST (``PUT .../inventory``)
is admitted by this table, not by a role.

Sidecars have no row: a sidecar authenticates with its own pod's token,
never with a cluster credential.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.contract import TUNNEL_AUDIENCE
from meshplane.distribution_contract import TOKEN_AUDIENCE
from meshplane.gateway_contract import GATEWAY_KIND, XDS_AUDIENCE
from meshplane.sidecar_contract import SIDECAR_KIND
from mgmt_api import fqn as fqnmod

#: The node kind of an agent's tunnel.
AGENT_KIND = "agent"
#: The audience of REST calls (a token without a stream audience).
REST = ""


@dataclass(frozen=True)
class Channel:
    """What a cluster credential may ask for: a token ``audience`` and a node ``kind``."""

    title: str
    audience: str
    kind: str


AGENT_TUNNEL = Channel("agent tunnel (inventory, diagnostics)", TUNNEL_AUDIENCE, AGENT_KIND)
INVENTORY_REPORT = Channel("inventory report (PUT .../inventory)", REST, AGENT_KIND)
GATEWAY_ADS = Channel("gateway ADS (its cluster's gateway config)", XDS_AUDIENCE, GATEWAY_KIND)
SIDECAR_ADS = Channel("sidecar ADS (workload certificates)", XDS_AUDIENCE, SIDECAR_KIND)
EXTAUTHZ_POLICIES = Channel("policy stream as extauthz", TOKEN_AUDIENCE, "extauthz")
RATELIMIT_POLICIES = Channel("policy stream as ratelimit", TOKEN_AUDIENCE, "ratelimit")
#: Every channel a cluster credential could ask for (rows of the docs' table).
CHANNELS = (
    AGENT_TUNNEL,
    INVENTORY_REPORT,
    GATEWAY_ADS,
    SIDECAR_ADS,
    EXTAUTHZ_POLICIES,
    RATELIMIT_POLICIES,
)


@dataclass(frozen=True)
class Account:
    """One of a cluster's service accounts: its name, the install template's
    ``helm.secrets`` entry holding its key, and what that key opens."""

    name: str
    template_secret: str
    channels: frozenset[Channel]
    description: str


ACCOUNTS: tuple[Account, ...] = (
    Account(
        fqnmod.AGENT_SERVICE_ACCOUNT,
        "clusterServiceAccount",
        frozenset({AGENT_TUNNEL, INVENTORY_REPORT}),
        "the cluster agent",
    ),
    Account("gateway", "gatewayServiceAccount", frozenset({GATEWAY_ADS}), "the cluster's gateways"),
    Account(
        "extauthz", "extauthzServiceAccount", frozenset({EXTAUTHZ_POLICIES}), "extauthz instances"
    ),
    Account(
        "ratelimit",
        "ratelimitServiceAccount",
        frozenset({RATELIMIT_POLICIES}),
        "ratelimit instances",
    ),
)
_BY_NAME = {account.name: account for account in ACCOUNTS}


def account_fqn(cluster_fqn: str, name: str) -> str:
    """The FQN of the cluster's account ``name``."""
    return fqnmod.child_fqn(cluster_fqn, "serviceaccounts", name)


def account_of(sa_fqn: str) -> tuple[str, Account] | None:
    """(cluster FQN, row) when ``sa_fqn`` is one of a cluster's accounts, else None."""
    cluster = fqnmod.cluster_of(sa_fqn)
    if cluster is None:
        return None
    prefix = f"{cluster}/serviceaccounts/"
    if not sa_fqn.startswith(prefix):
        return None
    account = _BY_NAME.get(sa_fqn.removeprefix(prefix))
    return (cluster, account) if account is not None else None


def refusal(sa_fqn: str, cluster_fqn: str, channel: Channel) -> str | None:
    """Why a key of ``sa_fqn`` may not open ``channel`` of ``cluster_fqn``; None: it may."""
    found = account_of(sa_fqn)
    if found is None or found[0] != cluster_fqn:
        return f"the credentials belong to {sa_fqn}, not to an account of {cluster_fqn}"
    if channel not in found[1].channels:
        return f"the credentials of {sa_fqn} do not open the {channel.title}"
    return None


def channel_for(audience: str, kind: str) -> Channel | None:
    """The channel a stream with this audience and node kind asks for."""
    for channel in CHANNELS:
        if channel.audience == audience and channel.kind == kind:
            return channel
    return None


def docs_table() -> str:
    """The table as docs/api.md shows it (a test keeps the two equal): one row per
    channel, one column per account, and the REST role each holds (none)."""
    head = "| Asks for | " + " | ".join(f"`{a.name}` key" for a in ACCOUNTS) + " |"
    rule = "|---|" + "---|" * len(ACCOUNTS)
    rows = [
        f"| {channel.title} | "
        + " | ".join("yes" if channel in a.channels else "refused" for a in ACCOUNTS)
        + " |"
        for channel in CHANNELS
    ]
    rest = (
        "| any other REST call (reads, writes: no role) | "
        + " | ".join("refused" for _ in ACCOUNTS)
        + " |"
    )
    return "\n".join([head, rule, *rows, rest])
