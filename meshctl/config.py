"""Profiles: where meshctl keeps servers, defaults and credentials.

The file is ``$XDG_CONFIG_HOME/meshctl/config.yaml`` (``~/.config/...`` when
the variable is unset; ``MESHCTL_CONFIG`` names another file). It holds
bearer tokens, so it is always written with mode 0600, atomically (a
temporary file in the same directory, then ``os.replace``) so a crash or a
concurrent meshctl never leaves half a file, and its directory is 0700.
Passwords are never stored: Basic login trades them for a session token.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from meshctl.errors import Exit, MeshctlError

DEFAULT_PROFILE = "default"
MASK = "***"


def config_path() -> Path:
    """The profile file, honouring ``MESHCTL_CONFIG`` and the XDG base directory spec."""
    explicit = os.environ.get("MESHCTL_CONFIG")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "meshctl" / "config.yaml"


@dataclass
class Credentials:
    """A platform bearer token and how it was obtained. Never printed unmasked."""

    method: str  # basic | browser | device-code | token-exchange
    access_token: str = field(repr=False)
    subject: str | None = None
    expires_at: datetime | None = None

    def expired(self, now: datetime) -> bool:
        return self.expires_at is not None and now >= self.expires_at

    def to_dict(self, *, masked: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {
            "method": self.method,
            "accessToken": MASK if masked else self.access_token,
        }
        if self.subject:
            out["subject"] = self.subject
        if self.expires_at is not None:
            out["expiresAt"] = self.expires_at.strftime("%Y-%m-%dT%H:%M:%SZ")
        return out

    @classmethod
    def from_dict(cls, raw: Any) -> Credentials | None:
        if not isinstance(raw, dict) or not isinstance(raw.get("accessToken"), str):
            return None
        expires: datetime | None = None
        if isinstance(raw.get("expiresAt"), str):
            with contextlib.suppress(ValueError):
                expires = datetime.strptime(raw["expiresAt"], "%Y-%m-%dT%H:%M:%SZ").replace(
                    tzinfo=UTC
                )
        elif isinstance(raw.get("expiresAt"), datetime):  # YAML timestamps parse as datetime
            expires = raw["expiresAt"].replace(tzinfo=raw["expiresAt"].tzinfo or UTC)
        subject = raw.get("subject")
        return cls(
            method=str(raw.get("method", "unknown")),
            access_token=raw["accessToken"],
            subject=subject if isinstance(subject, str) else None,
            expires_at=expires,
        )


@dataclass
class Profile:
    """One management plane and the defaults used with it."""

    name: str
    server: str | None = None
    organization: str | None = None
    tenant: str | None = None
    ca_file: str | None = None
    insecure_skip_verify: bool = False
    credentials: Credentials | None = None

    def to_dict(self, *, masked: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.server:
            out["server"] = self.server
        if self.organization:
            out["organization"] = self.organization
        if self.tenant:
            out["tenant"] = self.tenant
        if self.ca_file:
            out["caFile"] = self.ca_file
        if self.insecure_skip_verify:
            out["insecureSkipVerify"] = True
        if self.credentials is not None:
            out["credentials"] = self.credentials.to_dict(masked=masked)
        return out

    @classmethod
    def from_dict(cls, name: str, raw: Any) -> Profile:
        raw = raw if isinstance(raw, dict) else {}

        def text(key: str) -> str | None:
            value = raw.get(key)
            return value if isinstance(value, str) and value else None

        return cls(
            name=name,
            server=text("server"),
            organization=text("organization"),
            tenant=text("tenant"),
            ca_file=text("caFile"),
            insecure_skip_verify=raw.get("insecureSkipVerify") is True,
            credentials=Credentials.from_dict(raw.get("credentials")),
        )


@dataclass
class Config:
    """The whole file: profiles by name and the current one."""

    current: str = DEFAULT_PROFILE
    profiles: dict[str, Profile] = field(default_factory=dict)
    path: Path = field(default_factory=config_path)

    def profile(self, name: str | None = None) -> Profile:
        """The named (or current) profile, created empty when it does not exist yet."""
        key = name or self.current
        if key not in self.profiles:
            self.profiles[key] = Profile(name=key)
        return self.profiles[key]

    def to_dict(self, *, masked: bool = False) -> dict[str, Any]:
        return {
            "currentProfile": self.current,
            "profiles": {n: p.to_dict(masked=masked) for n, p in sorted(self.profiles.items())},
        }

    def save(self) -> None:
        """Write atomically with 0600 permissions (the file holds bearer tokens)."""
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        text = yaml.safe_dump(self.to_dict(), sort_keys=False)
        fd, tmp = tempfile.mkstemp(prefix=".config-", suffix=".yaml", dir=self.path.parent)
        try:
            os.fchmod(fd, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(text)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise


def load_config(path: Path | None = None) -> Config:
    """Read the profile file; a missing file is an empty configuration."""
    path = path or config_path()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return Config(path=path)
    except OSError as exc:
        raise MeshctlError(f"cannot read {path}: {exc.strerror}", Exit.USAGE) from exc
    try:
        raw = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise MeshctlError(
            f"{path} is not valid YAML ({exc.__class__.__name__}); fix or remove it", Exit.USAGE
        ) from exc
    if not isinstance(raw, dict):
        raise MeshctlError(f"{path} must hold a mapping; fix or remove it", Exit.USAGE)
    profiles_raw = raw.get("profiles") if isinstance(raw.get("profiles"), dict) else {}
    assert isinstance(profiles_raw, dict)
    current = raw.get("currentProfile")
    return Config(
        current=current if isinstance(current, str) and current else DEFAULT_PROFILE,
        profiles={str(n): Profile.from_dict(str(n), p) for n, p in profiles_raw.items()},
        path=path,
    )
