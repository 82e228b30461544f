from loops.backend.v1 import backend_pb2 as _backend_pb2
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RegisterRequest(_message.Message):
    __slots__ = ("pool_id", "replica", "address", "incarnation_id", "join_token", "capabilities", "gpus")
    POOL_ID_FIELD_NUMBER: _ClassVar[int]
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_ID_FIELD_NUMBER: _ClassVar[int]
    JOIN_TOKEN_FIELD_NUMBER: _ClassVar[int]
    CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    pool_id: str
    replica: int
    address: str
    incarnation_id: str
    join_token: str
    capabilities: _backend_pb2.GetCapabilitiesResponse
    gpus: int
    def __init__(self, pool_id: _Optional[str] = ..., replica: _Optional[int] = ..., address: _Optional[str] = ..., incarnation_id: _Optional[str] = ..., join_token: _Optional[str] = ..., capabilities: _Optional[_Union[_backend_pb2.GetCapabilitiesResponse, _Mapping]] = ..., gpus: _Optional[int] = ...) -> None: ...

class RegisterResponse(_message.Message):
    __slots__ = ("lease_id", "heartbeat_interval_ms", "heartbeat_timeout_ms")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    heartbeat_interval_ms: int
    heartbeat_timeout_ms: int
    def __init__(self, lease_id: _Optional[str] = ..., heartbeat_interval_ms: _Optional[int] = ..., heartbeat_timeout_ms: _Optional[int] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("lease_id",)
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    def __init__(self, lease_id: _Optional[str] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("drain",)
    DRAIN_FIELD_NUMBER: _ClassVar[int]
    drain: bool
    def __init__(self, drain: _Optional[bool] = ...) -> None: ...

class DeregisterRequest(_message.Message):
    __slots__ = ("lease_id",)
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    def __init__(self, lease_id: _Optional[str] = ...) -> None: ...

class DeregisterResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WatchPoolRequest(_message.Message):
    __slots__ = ("pool_id", "join_token")
    POOL_ID_FIELD_NUMBER: _ClassVar[int]
    JOIN_TOKEN_FIELD_NUMBER: _ClassVar[int]
    pool_id: str
    join_token: str
    def __init__(self, pool_id: _Optional[str] = ..., join_token: _Optional[str] = ...) -> None: ...

class WatchPoolResponse(_message.Message):
    __slots__ = ("desired_replicas",)
    DESIRED_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    desired_replicas: int
    def __init__(self, desired_replicas: _Optional[int] = ...) -> None: ...
