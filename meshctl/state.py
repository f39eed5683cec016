"""Global options of one meshctl run, shared by every command group."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import UTC, datetime

import typer

from meshctl.client import ApiClient
from meshctl.config import Config, Profile, load_config
from meshctl.errors import Exit, MeshctlError


@dataclass
class State:
    """``--profile``, ``--server`` and ``--verbose``, attached to the root click context."""

    profile: str | None
    server: str | None
    verbose: bool

    def load(self) -> tuple[Config, Profile]:
        config = load_config()
        return config, config.profile(self.profile)

    def effective(self, profile: Profile) -> Profile:
        """The profile with the per-run ``--server`` override (never saved)."""
        return dataclasses.replace(profile, server=self.server) if self.server else profile

    def client(self) -> ApiClient:
        """An authenticated client, or a refusal telling the user to log in."""
        _, profile = self.load()
        profile = self.effective(profile)
        creds = profile.credentials
        if creds is None:
            raise MeshctlError(
                f"not logged in (profile {profile.name!r}); run meshctl login", Exit.AUTH
            )
        if creds.expired(datetime.now(UTC)):
            raise MeshctlError(
                f"your session for profile {profile.name!r} expired; run meshctl login again",
                Exit.AUTH,
            )
        return ApiClient(profile, token=creds.access_token, verbose=self.verbose)


def state_of(ctx: typer.Context) -> State:
    obj = ctx.find_root().obj
    assert isinstance(obj, State), "the root callback sets the state"
    return obj
