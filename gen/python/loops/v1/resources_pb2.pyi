import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from loops.v1 import types_pb2 as _types_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CheckpointKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CHECKPOINT_KIND_UNSPECIFIED: _ClassVar[CheckpointKind]
    CHECKPOINT_KIND_TRAINING: _ClassVar[CheckpointKind]
    CHECKPOINT_KIND_SAMPLER: _ClassVar[CheckpointKind]
    CHECKPOINT_KIND_EXTERNAL: _ClassVar[CheckpointKind]
CHECKPOINT_KIND_UNSPECIFIED: CheckpointKind
CHECKPOINT_KIND_TRAINING: CheckpointKind
CHECKPOINT_KIND_SAMPLER: CheckpointKind
CHECKPOINT_KIND_EXTERNAL: CheckpointKind

class Session(_message.Message):
    __slots__ = ("id", "tags", "user_metadata", "sdk_version", "project_id", "create_time", "last_heartbeat_time", "training_run_ids", "sampler_ids", "expired", "end_reason", "display_name", "owner")
    class UserMetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    USER_METADATA_FIELD_NUMBER: _ClassVar[int]
    SDK_VERSION_FIELD_NUMBER: _ClassVar[int]
    PROJECT_ID_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    LAST_HEARTBEAT_TIME_FIELD_NUMBER: _ClassVar[int]
    TRAINING_RUN_IDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLER_IDS_FIELD_NUMBER: _ClassVar[int]
    EXPIRED_FIELD_NUMBER: _ClassVar[int]
    END_REASON_FIELD_NUMBER: _ClassVar[int]
    DISPLAY_NAME_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    id: str
    tags: _containers.RepeatedScalarFieldContainer[str]
    user_metadata: _containers.ScalarMap[str, str]
    sdk_version: str
    project_id: str
    create_time: _timestamp_pb2.Timestamp
    last_heartbeat_time: _timestamp_pb2.Timestamp
    training_run_ids: _containers.RepeatedScalarFieldContainer[str]
    sampler_ids: _containers.RepeatedScalarFieldContainer[str]
    expired: bool
    end_reason: str
    display_name: str
    owner: str
    def __init__(self, id: _Optional[str] = ..., tags: _Optional[_Iterable[str]] = ..., user_metadata: _Optional[_Mapping[str, str]] = ..., sdk_version: _Optional[str] = ..., project_id: _Optional[str] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., last_heartbeat_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., training_run_ids: _Optional[_Iterable[str]] = ..., sampler_ids: _Optional[_Iterable[str]] = ..., expired: _Optional[bool] = ..., end_reason: _Optional[str] = ..., display_name: _Optional[str] = ..., owner: _Optional[str] = ...) -> None: ...

class TrainingRun(_message.Message):
    __slots__ = ("id", "session_id", "base_model", "lora", "user_metadata", "create_time", "last_request_time", "last_checkpoint", "last_sampler_checkpoint", "corrupted", "last_seq_id", "client_seq_id", "unload_reason", "optim_steps", "dedicated_pool", "inflight_sampler_checkpoint", "client", "base_model_revision", "record_data", "recorded_data_bytes", "record_data_stopped", "receipt_steps", "receipt_truncated", "from_checkpoint", "owner")
    class UserMetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    BASE_MODEL_FIELD_NUMBER: _ClassVar[int]
    LORA_FIELD_NUMBER: _ClassVar[int]
    USER_METADATA_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    LAST_REQUEST_TIME_FIELD_NUMBER: _ClassVar[int]
    LAST_CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    LAST_SAMPLER_CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    CORRUPTED_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQ_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_SEQ_ID_FIELD_NUMBER: _ClassVar[int]
    UNLOAD_REASON_FIELD_NUMBER: _ClassVar[int]
    OPTIM_STEPS_FIELD_NUMBER: _ClassVar[int]
    DEDICATED_POOL_FIELD_NUMBER: _ClassVar[int]
    INFLIGHT_SAMPLER_CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    CLIENT_FIELD_NUMBER: _ClassVar[int]
    BASE_MODEL_REVISION_FIELD_NUMBER: _ClassVar[int]
    RECORD_DATA_FIELD_NUMBER: _ClassVar[int]
    RECORDED_DATA_BYTES_FIELD_NUMBER: _ClassVar[int]
    RECORD_DATA_STOPPED_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_STEPS_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    FROM_CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    id: str
    session_id: str
    base_model: str
    lora: _types_pb2.LoraConfig
    user_metadata: _containers.ScalarMap[str, str]
    create_time: _timestamp_pb2.Timestamp
    last_request_time: _timestamp_pb2.Timestamp
    last_checkpoint: Checkpoint
    last_sampler_checkpoint: Checkpoint
    corrupted: bool
    last_seq_id: int
    client_seq_id: int
    unload_reason: str
    optim_steps: int
    dedicated_pool: str
    inflight_sampler_checkpoint: Checkpoint
    client: _types_pb2.ClientInfo
    base_model_revision: str
    record_data: bool
    recorded_data_bytes: int
    record_data_stopped: str
    receipt_steps: int
    receipt_truncated: bool
    from_checkpoint: str
    owner: str
    def __init__(self, id: _Optional[str] = ..., session_id: _Optional[str] = ..., base_model: _Optional[str] = ..., lora: _Optional[_Union[_types_pb2.LoraConfig, _Mapping]] = ..., user_metadata: _Optional[_Mapping[str, str]] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., last_request_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., last_checkpoint: _Optional[_Union[Checkpoint, _Mapping]] = ..., last_sampler_checkpoint: _Optional[_Union[Checkpoint, _Mapping]] = ..., corrupted: _Optional[bool] = ..., last_seq_id: _Optional[int] = ..., client_seq_id: _Optional[int] = ..., unload_reason: _Optional[str] = ..., optim_steps: _Optional[int] = ..., dedicated_pool: _Optional[str] = ..., inflight_sampler_checkpoint: _Optional[_Union[Checkpoint, _Mapping]] = ..., client: _Optional[_Union[_types_pb2.ClientInfo, _Mapping]] = ..., base_model_revision: _Optional[str] = ..., record_data: _Optional[bool] = ..., recorded_data_bytes: _Optional[int] = ..., record_data_stopped: _Optional[str] = ..., receipt_steps: _Optional[int] = ..., receipt_truncated: _Optional[bool] = ..., from_checkpoint: _Optional[str] = ..., owner: _Optional[str] = ...) -> None: ...

class Checkpoint(_message.Message):
    __slots__ = ("id", "training_run_id", "kind", "name", "tinker_path", "size_bytes", "public", "create_time", "expire_time", "base_model", "lora", "project_id", "copied_from", "step", "retention_delete_time")
    ID_FIELD_NUMBER: _ClassVar[int]
    TRAINING_RUN_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    TINKER_PATH_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    PUBLIC_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    EXPIRE_TIME_FIELD_NUMBER: _ClassVar[int]
    BASE_MODEL_FIELD_NUMBER: _ClassVar[int]
    LORA_FIELD_NUMBER: _ClassVar[int]
    PROJECT_ID_FIELD_NUMBER: _ClassVar[int]
    COPIED_FROM_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    RETENTION_DELETE_TIME_FIELD_NUMBER: _ClassVar[int]
    id: str
    training_run_id: str
    kind: CheckpointKind
    name: str
    tinker_path: str
    size_bytes: int
    public: bool
    create_time: _timestamp_pb2.Timestamp
    expire_time: _timestamp_pb2.Timestamp
    base_model: str
    lora: _types_pb2.LoraConfig
    project_id: str
    copied_from: str
    step: int
    retention_delete_time: _timestamp_pb2.Timestamp
    def __init__(self, id: _Optional[str] = ..., training_run_id: _Optional[str] = ..., kind: _Optional[_Union[CheckpointKind, str]] = ..., name: _Optional[str] = ..., tinker_path: _Optional[str] = ..., size_bytes: _Optional[int] = ..., public: _Optional[bool] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., expire_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., base_model: _Optional[str] = ..., lora: _Optional[_Union[_types_pb2.LoraConfig, _Mapping]] = ..., project_id: _Optional[str] = ..., copied_from: _Optional[str] = ..., step: _Optional[int] = ..., retention_delete_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class Sampler(_message.Message):
    __slots__ = ("id", "session_id", "base_model", "model_path", "create_time", "deployment", "inflight_run_id", "clients")
    ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    BASE_MODEL_FIELD_NUMBER: _ClassVar[int]
    MODEL_PATH_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    INFLIGHT_RUN_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENTS_FIELD_NUMBER: _ClassVar[int]
    id: str
    session_id: str
    base_model: str
    model_path: str
    create_time: _timestamp_pb2.Timestamp
    deployment: str
    inflight_run_id: str
    clients: int
    def __init__(self, id: _Optional[str] = ..., session_id: _Optional[str] = ..., base_model: _Optional[str] = ..., model_path: _Optional[str] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., deployment: _Optional[str] = ..., inflight_run_id: _Optional[str] = ..., clients: _Optional[int] = ...) -> None: ...
