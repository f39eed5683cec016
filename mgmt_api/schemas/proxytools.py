"""Request and response records of the proxy diagnostics (spec 4.9, ``.../proxytools``).

Requests are strict: a wrong JSON type is a 400 naming the field, never
coerced. Every request selects the workload (``namespace``, ``workload``,
optionally one ``instance``; default every instance, each answered
separately). Responses list one entry per instance: its answer, or its
``error`` (a google.rpc.Status) when that proxy failed while others answered.
"""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, Field

from agent.contract import MAX_TAIL_LINES
from mgmt_api.schemas.base import ApiModel


class StrictModel(ApiModel):
    model_config = ConfigDict(strict=True)


class WorkloadSelector(StrictModel):
    namespace: str = Field(max_length=63, description="The workload's namespace.")
    workload: str = Field(max_length=63, description="The workload (deployment, VM group).")
    instance: str = Field(
        default="",
        max_length=253,
        description="One instance (pod name); default every instance, each answered separately.",
    )


class GetClusterStatsRequest(WorkloadSelector):
    pass


class GetServerStatsRequest(WorkloadSelector):
    filter: str = Field(default="", max_length=1024, description="RE2 regex over stat names.")
    used_only: bool = Field(default=False, description="Only stats that were written to.")
    include_server_info: bool = Field(
        default=False,
        description="Also Envoy's /server_info (node, version, options: about 4,000 lines).",
    )


class GetConfigDumpRequest(WorkloadSelector):
    resource: str = Field(default="", max_length=128, description="e.g. dynamic_active_clusters")
    mask: str = Field(default="", max_length=512, description="A field mask, e.g. cluster.name")
    include_eds: bool = Field(default=False, description="Include endpoint (EDS) config.")


class GetLoggerLevelsRequest(WorkloadSelector):
    pass


class SetLoggerLevelsRequest(WorkloadSelector):
    level: str = Field(default="", description="Set every logger to this level, or ...")
    loggers: dict[str, str] = Field(
        default_factory=dict, description="... set these loggers (name → level)."
    )


class StreamLogsRequest(WorkloadSelector):
    follow: bool = Field(default=False, description="Keep streaming new lines.")
    tail_lines: int | None = Field(
        default=None,
        ge=0,
        le=MAX_TAIL_LINES,
        description="Start with this many last lines (default 100 without since).",
    )
    since_seconds: int | None = Field(default=None, ge=1, description="Only lines this recent.")


class Status(ApiModel):
    code: int
    message: str
    details: list[dict[str, Any]] = Field(default_factory=list)


class InstanceRef(ApiModel):
    namespace: str
    workload: str
    instance: str
    error: Status | None = Field(default=None, description="Set when this instance failed.")


class ClusterStatsInstance(InstanceRef):
    cluster_stats: dict[str, Any] | None = Field(
        default=None, description="Envoy's /clusters?format=json."
    )


class GetClusterStatsResponse(ApiModel):
    instances: list[ClusterStatsInstance]


class ServerStatsInstance(InstanceRef):
    server_info: dict[str, Any] | None = Field(
        default=None, description="Envoy's /server_info, when includeServerInfo was set."
    )
    stats: list[Any] | None = Field(
        default=None, description="Envoy's /stats?format=json (filtered)."
    )


class GetServerStatsResponse(ApiModel):
    instances: list[ServerStatsInstance]


class ConfigDumpInstance(InstanceRef):
    config_dump: dict[str, Any] | None = Field(
        default=None, description="Envoy's /config_dump, with secrets redacted by the agent."
    )
    redacted_fields: int | None = Field(
        default=None, description="How many values the agent replaced with [redacted]."
    )


class GetConfigDumpResponse(ApiModel):
    instances: list[ConfigDumpInstance]


class LoggerLevelsInstance(InstanceRef):
    levels: dict[str, str] | None = Field(default=None, description="logger → level.")


class LoggerLevelsResponse(ApiModel):
    instances: list[LoggerLevelsInstance]


class LogLine(ApiModel):
    """One line of ``streamlogs`` (NDJSON, or SSE ``data:``)."""

    namespace: str
    workload: str
    instance: str
    line: str | None = None
    time: str | None = Field(default=None, description="RFC 3339.")
    error: Status | None = Field(
        default=None, description="This instance's stream failed (no log file, API refused)."
    )
