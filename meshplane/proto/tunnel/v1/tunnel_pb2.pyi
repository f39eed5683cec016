from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AgentHello(_message.Message):
    __slots__ = ("organization", "cluster", "instance", "version")
    ORGANIZATION_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    organization: str
    cluster: str
    instance: str
    version: str
    def __init__(self, organization: _Optional[str] = ..., cluster: _Optional[str] = ..., instance: _Optional[str] = ..., version: _Optional[str] = ...) -> None: ...

class AgentMessage(_message.Message):
    __slots__ = ("hello", "reply", "inventory", "heartbeat")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    REPLY_FIELD_NUMBER: _ClassVar[int]
    INVENTORY_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    hello: AgentHello
    reply: Reply
    inventory: Inventory
    heartbeat: Heartbeat
    def __init__(self, hello: _Optional[_Union[AgentHello, _Mapping]] = ..., reply: _Optional[_Union[Reply, _Mapping]] = ..., inventory: _Optional[_Union[Inventory, _Mapping]] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ...) -> None: ...

class Heartbeat(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Inventory(_message.Message):
    __slots__ = ("report_json", "sequence")
    REPORT_JSON_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    report_json: bytes
    sequence: int
    def __init__(self, report_json: _Optional[bytes] = ..., sequence: _Optional[int] = ...) -> None: ...

class ServerMessage(_message.Message):
    __slots__ = ("call", "cancel", "inventory_result")
    CALL_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    INVENTORY_RESULT_FIELD_NUMBER: _ClassVar[int]
    call: Call
    cancel: Cancel
    inventory_result: InventoryResult
    def __init__(self, call: _Optional[_Union[Call, _Mapping]] = ..., cancel: _Optional[_Union[Cancel, _Mapping]] = ..., inventory_result: _Optional[_Union[InventoryResult, _Mapping]] = ...) -> None: ...

class InventoryResult(_message.Message):
    __slots__ = ("sequence", "error")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    error: str
    def __init__(self, sequence: _Optional[int] = ..., error: _Optional[str] = ...) -> None: ...

class Workload(_message.Message):
    __slots__ = ("namespace", "workload", "instance")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    WORKLOAD_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    workload: str
    instance: str
    def __init__(self, namespace: _Optional[str] = ..., workload: _Optional[str] = ..., instance: _Optional[str] = ...) -> None: ...

class Call(_message.Message):
    __slots__ = ("id", "target", "timeout_ms", "traceparent", "tracestate", "cluster_stats", "server_stats", "config_dump", "get_loggers", "set_loggers", "stream_logs")
    ID_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    TRACEPARENT_FIELD_NUMBER: _ClassVar[int]
    TRACESTATE_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_STATS_FIELD_NUMBER: _ClassVar[int]
    SERVER_STATS_FIELD_NUMBER: _ClassVar[int]
    CONFIG_DUMP_FIELD_NUMBER: _ClassVar[int]
    GET_LOGGERS_FIELD_NUMBER: _ClassVar[int]
    SET_LOGGERS_FIELD_NUMBER: _ClassVar[int]
    STREAM_LOGS_FIELD_NUMBER: _ClassVar[int]
    id: int
    target: Workload
    timeout_ms: int
    traceparent: str
    tracestate: str
    cluster_stats: ClusterStats
    server_stats: ServerStats
    config_dump: ConfigDump
    get_loggers: GetLoggers
    set_loggers: SetLoggers
    stream_logs: StreamLogs
    def __init__(self, id: _Optional[int] = ..., target: _Optional[_Union[Workload, _Mapping]] = ..., timeout_ms: _Optional[int] = ..., traceparent: _Optional[str] = ..., tracestate: _Optional[str] = ..., cluster_stats: _Optional[_Union[ClusterStats, _Mapping]] = ..., server_stats: _Optional[_Union[ServerStats, _Mapping]] = ..., config_dump: _Optional[_Union[ConfigDump, _Mapping]] = ..., get_loggers: _Optional[_Union[GetLoggers, _Mapping]] = ..., set_loggers: _Optional[_Union[SetLoggers, _Mapping]] = ..., stream_logs: _Optional[_Union[StreamLogs, _Mapping]] = ...) -> None: ...

class ClusterStats(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ServerStats(_message.Message):
    __slots__ = ("filter", "used_only", "include_server_info")
    FILTER_FIELD_NUMBER: _ClassVar[int]
    USED_ONLY_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_SERVER_INFO_FIELD_NUMBER: _ClassVar[int]
    filter: str
    used_only: bool
    include_server_info: bool
    def __init__(self, filter: _Optional[str] = ..., used_only: _Optional[bool] = ..., include_server_info: _Optional[bool] = ...) -> None: ...

class ConfigDump(_message.Message):
    __slots__ = ("resource", "mask", "include_eds")
    RESOURCE_FIELD_NUMBER: _ClassVar[int]
    MASK_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_EDS_FIELD_NUMBER: _ClassVar[int]
    resource: str
    mask: str
    include_eds: bool
    def __init__(self, resource: _Optional[str] = ..., mask: _Optional[str] = ..., include_eds: _Optional[bool] = ...) -> None: ...

class GetLoggers(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SetLoggers(_message.Message):
    __slots__ = ("level", "loggers")
    class LoggersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    LOGGERS_FIELD_NUMBER: _ClassVar[int]
    level: str
    loggers: _containers.ScalarMap[str, str]
    def __init__(self, level: _Optional[str] = ..., loggers: _Optional[_Mapping[str, str]] = ...) -> None: ...

class StreamLogs(_message.Message):
    __slots__ = ("follow", "tail_lines", "since_seconds")
    FOLLOW_FIELD_NUMBER: _ClassVar[int]
    TAIL_LINES_FIELD_NUMBER: _ClassVar[int]
    SINCE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    follow: bool
    tail_lines: int
    since_seconds: int
    def __init__(self, follow: _Optional[bool] = ..., tail_lines: _Optional[int] = ..., since_seconds: _Optional[int] = ...) -> None: ...

class Cancel(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: int
    def __init__(self, id: _Optional[int] = ...) -> None: ...

class Status(_message.Message):
    __slots__ = ("code", "message", "field")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    FIELD_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    field: str
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ..., field: _Optional[str] = ...) -> None: ...

class Reply(_message.Message):
    __slots__ = ("id", "chunk", "instance_done", "log", "done", "started")
    ID_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_DONE_FIELD_NUMBER: _ClassVar[int]
    LOG_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    STARTED_FIELD_NUMBER: _ClassVar[int]
    id: int
    chunk: Chunk
    instance_done: InstanceDone
    log: LogLine
    done: Status
    started: Started
    def __init__(self, id: _Optional[int] = ..., chunk: _Optional[_Union[Chunk, _Mapping]] = ..., instance_done: _Optional[_Union[InstanceDone, _Mapping]] = ..., log: _Optional[_Union[LogLine, _Mapping]] = ..., done: _Optional[_Union[Status, _Mapping]] = ..., started: _Optional[_Union[Started, _Mapping]] = ...) -> None: ...

class Started(_message.Message):
    __slots__ = ("workloads",)
    WORKLOADS_FIELD_NUMBER: _ClassVar[int]
    workloads: _containers.RepeatedCompositeFieldContainer[Workload]
    def __init__(self, workloads: _Optional[_Iterable[_Union[Workload, _Mapping]]] = ...) -> None: ...

class Chunk(_message.Message):
    __slots__ = ("instance", "data")
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    instance: str
    data: bytes
    def __init__(self, instance: _Optional[str] = ..., data: _Optional[bytes] = ...) -> None: ...

class InstanceDone(_message.Message):
    __slots__ = ("workload", "status")
    WORKLOAD_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    workload: Workload
    status: Status
    def __init__(self, workload: _Optional[_Union[Workload, _Mapping]] = ..., status: _Optional[_Union[Status, _Mapping]] = ...) -> None: ...

class LogLine(_message.Message):
    __slots__ = ("workload", "line", "time")
    WORKLOAD_FIELD_NUMBER: _ClassVar[int]
    LINE_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    workload: Workload
    line: str
    time: str
    def __init__(self, workload: _Optional[_Union[Workload, _Mapping]] = ..., line: _Optional[str] = ..., time: _Optional[str] = ...) -> None: ...
