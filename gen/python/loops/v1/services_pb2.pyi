import datetime

from google.api import annotations_pb2 as _annotations_pb2
from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from loops.v1 import operations_pb2 as _operations_pb2
from loops.v1 import resources_pb2 as _resources_pb2
from loops.v1 import types_pb2 as _types_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ExportFormat(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EXPORT_FORMAT_UNSPECIFIED: _ClassVar[ExportFormat]
    EXPORT_FORMAT_PEFT: _ClassVar[ExportFormat]
    EXPORT_FORMAT_MERGED: _ClassVar[ExportFormat]

class UsageKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    USAGE_KIND_UNSPECIFIED: _ClassVar[UsageKind]
    USAGE_KIND_TRAINING_TOKENS: _ClassVar[UsageKind]
    USAGE_KIND_SAMPLING_PREFILL_TOKENS: _ClassVar[UsageKind]
    USAGE_KIND_SAMPLING_SAMPLE_TOKENS: _ClassVar[UsageKind]
    USAGE_KIND_CHECKPOINTS: _ClassVar[UsageKind]
    USAGE_KIND_DEDICATED_REPLICA_SECONDS: _ClassVar[UsageKind]
    USAGE_KIND_DEDICATED_GPU_SECONDS: _ClassVar[UsageKind]
    USAGE_KIND_SAMPLING_CACHED_PREFILL_TOKENS: _ClassVar[UsageKind]
    USAGE_KIND_CHECKPOINT_BYTE_SECONDS: _ClassVar[UsageKind]
EXPORT_FORMAT_UNSPECIFIED: ExportFormat
EXPORT_FORMAT_PEFT: ExportFormat
EXPORT_FORMAT_MERGED: ExportFormat
USAGE_KIND_UNSPECIFIED: UsageKind
USAGE_KIND_TRAINING_TOKENS: UsageKind
USAGE_KIND_SAMPLING_PREFILL_TOKENS: UsageKind
USAGE_KIND_SAMPLING_SAMPLE_TOKENS: UsageKind
USAGE_KIND_CHECKPOINTS: UsageKind
USAGE_KIND_DEDICATED_REPLICA_SECONDS: UsageKind
USAGE_KIND_DEDICATED_GPU_SECONDS: UsageKind
USAGE_KIND_SAMPLING_CACHED_PREFILL_TOKENS: UsageKind
USAGE_KIND_CHECKPOINT_BYTE_SECONDS: UsageKind

class CreateSessionRequest(_message.Message):
    __slots__ = ("tags", "user_metadata", "sdk_version", "project_id", "display_name")
    class UserMetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TAGS_FIELD_NUMBER: _ClassVar[int]
    USER_METADATA_FIELD_NUMBER: _ClassVar[int]
    SDK_VERSION_FIELD_NUMBER: _ClassVar[int]
    PROJECT_ID_FIELD_NUMBER: _ClassVar[int]
    DISPLAY_NAME_FIELD_NUMBER: _ClassVar[int]
    tags: _containers.RepeatedScalarFieldContainer[str]
    user_metadata: _containers.ScalarMap[str, str]
    sdk_version: str
    project_id: str
    display_name: str
    def __init__(self, tags: _Optional[_Iterable[str]] = ..., user_metadata: _Optional[_Mapping[str, str]] = ..., sdk_version: _Optional[str] = ..., project_id: _Optional[str] = ..., display_name: _Optional[str] = ...) -> None: ...

class HeartbeatSessionRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class HeartbeatSessionResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class FinishSessionRequest(_message.Message):
    __slots__ = ("id", "reason", "detail")
    ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    id: str
    reason: str
    detail: str
    def __init__(self, id: _Optional[str] = ..., reason: _Optional[str] = ..., detail: _Optional[str] = ...) -> None: ...

class GetSessionRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class ListSessionsRequest(_message.Message):
    __slots__ = ("limit", "offset", "page_token")
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    limit: int
    offset: int
    page_token: str
    def __init__(self, limit: _Optional[int] = ..., offset: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListSessionsResponse(_message.Message):
    __slots__ = ("sessions", "total_count", "next_page_token")
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_COUNT_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    sessions: _containers.RepeatedCompositeFieldContainer[_resources_pb2.Session]
    total_count: int
    next_page_token: str
    def __init__(self, sessions: _Optional[_Iterable[_Union[_resources_pb2.Session, _Mapping]]] = ..., total_count: _Optional[int] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class SearchSessionsRequest(_message.Message):
    __slots__ = ("session_id", "display_name", "project_ids", "user_metadata", "tags", "created_after", "created_before", "statuses", "owners", "own", "limit", "page_token", "after")
    class UserMetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    DISPLAY_NAME_FIELD_NUMBER: _ClassVar[int]
    PROJECT_IDS_FIELD_NUMBER: _ClassVar[int]
    USER_METADATA_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    CREATED_AFTER_FIELD_NUMBER: _ClassVar[int]
    CREATED_BEFORE_FIELD_NUMBER: _ClassVar[int]
    STATUSES_FIELD_NUMBER: _ClassVar[int]
    OWNERS_FIELD_NUMBER: _ClassVar[int]
    OWN_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    display_name: str
    project_ids: _containers.RepeatedScalarFieldContainer[str]
    user_metadata: _containers.ScalarMap[str, str]
    tags: _containers.RepeatedScalarFieldContainer[str]
    created_after: _timestamp_pb2.Timestamp
    created_before: _timestamp_pb2.Timestamp
    statuses: _containers.RepeatedScalarFieldContainer[str]
    owners: _containers.RepeatedScalarFieldContainer[str]
    own: bool
    limit: int
    page_token: str
    after: SessionSearchCursor
    def __init__(self, session_id: _Optional[str] = ..., display_name: _Optional[str] = ..., project_ids: _Optional[_Iterable[str]] = ..., user_metadata: _Optional[_Mapping[str, str]] = ..., tags: _Optional[_Iterable[str]] = ..., created_after: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., created_before: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., statuses: _Optional[_Iterable[str]] = ..., owners: _Optional[_Iterable[str]] = ..., own: _Optional[bool] = ..., limit: _Optional[int] = ..., page_token: _Optional[str] = ..., after: _Optional[_Union[SessionSearchCursor, _Mapping]] = ...) -> None: ...

class SessionSearchCursor(_message.Message):
    __slots__ = ("create_time", "session_id")
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    create_time: _timestamp_pb2.Timestamp
    session_id: str
    def __init__(self, create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., session_id: _Optional[str] = ...) -> None: ...

class SessionSearchResult(_message.Message):
    __slots__ = ("session", "checkpoint_count")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_COUNT_FIELD_NUMBER: _ClassVar[int]
    session: _resources_pb2.Session
    checkpoint_count: int
    def __init__(self, session: _Optional[_Union[_resources_pb2.Session, _Mapping]] = ..., checkpoint_count: _Optional[int] = ...) -> None: ...

class SearchSessionsResponse(_message.Message):
    __slots__ = ("results", "next_page_token")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[SessionSearchResult]
    next_page_token: str
    def __init__(self, results: _Optional[_Iterable[_Union[SessionSearchResult, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class SetSessionProjectRequest(_message.Message):
    __slots__ = ("id", "project_id")
    ID_FIELD_NUMBER: _ClassVar[int]
    PROJECT_ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    project_id: str
    def __init__(self, id: _Optional[str] = ..., project_id: _Optional[str] = ...) -> None: ...

class CreateTrainingRunRequest(_message.Message):
    __slots__ = ("session_id", "client_seq_id", "base_model", "lora", "user_metadata", "from_checkpoint", "with_optimizer", "dedicated", "weights_access_token", "client", "record_data")
    class UserMetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_SEQ_ID_FIELD_NUMBER: _ClassVar[int]
    BASE_MODEL_FIELD_NUMBER: _ClassVar[int]
    LORA_FIELD_NUMBER: _ClassVar[int]
    USER_METADATA_FIELD_NUMBER: _ClassVar[int]
    FROM_CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    WITH_OPTIMIZER_FIELD_NUMBER: _ClassVar[int]
    DEDICATED_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_ACCESS_TOKEN_FIELD_NUMBER: _ClassVar[int]
    CLIENT_FIELD_NUMBER: _ClassVar[int]
    RECORD_DATA_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    client_seq_id: int
    base_model: str
    lora: _types_pb2.LoraConfig
    user_metadata: _containers.ScalarMap[str, str]
    from_checkpoint: str
    with_optimizer: bool
    dedicated: DedicatedPool
    weights_access_token: str
    client: _types_pb2.ClientInfo
    record_data: bool
    def __init__(self, session_id: _Optional[str] = ..., client_seq_id: _Optional[int] = ..., base_model: _Optional[str] = ..., lora: _Optional[_Union[_types_pb2.LoraConfig, _Mapping]] = ..., user_metadata: _Optional[_Mapping[str, str]] = ..., from_checkpoint: _Optional[str] = ..., with_optimizer: _Optional[bool] = ..., dedicated: _Optional[_Union[DedicatedPool, _Mapping]] = ..., weights_access_token: _Optional[str] = ..., client: _Optional[_Union[_types_pb2.ClientInfo, _Mapping]] = ..., record_data: _Optional[bool] = ...) -> None: ...

class DedicatedPool(_message.Message):
    __slots__ = ("replicas", "sampler_replicas")
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    SAMPLER_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    replicas: int
    sampler_replicas: int
    def __init__(self, replicas: _Optional[int] = ..., sampler_replicas: _Optional[int] = ...) -> None: ...

class GetTrainingRunRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class GetTrainingRunMetricsRequest(_message.Message):
    __slots__ = ("training_run_id", "from_step", "to_step", "max_points")
    TRAINING_RUN_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_STEP_FIELD_NUMBER: _ClassVar[int]
    TO_STEP_FIELD_NUMBER: _ClassVar[int]
    MAX_POINTS_FIELD_NUMBER: _ClassVar[int]
    training_run_id: str
    from_step: int
    to_step: int
    max_points: int
    def __init__(self, training_run_id: _Optional[str] = ..., from_step: _Optional[int] = ..., to_step: _Optional[int] = ..., max_points: _Optional[int] = ...) -> None: ...

class GetTrainingRunMetricsResponse(_message.Message):
    __slots__ = ("steps",)
    STEPS_FIELD_NUMBER: _ClassVar[int]
    steps: _containers.RepeatedCompositeFieldContainer[StepMetrics]
    def __init__(self, steps: _Optional[_Iterable[_Union[StepMetrics, _Mapping]]] = ...) -> None: ...

class StepMetrics(_message.Message):
    __slots__ = ("kind", "seq_id", "last_seq_id", "step", "last_step", "count", "time", "backend_seconds", "loss_fn", "loss_sum", "loss_mean", "tokens", "loss_tokens", "examples", "rl", "learning_rate", "grad_norm", "training_run_id", "update_norm", "cost_usd")
    KIND_FIELD_NUMBER: _ClassVar[int]
    SEQ_ID_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQ_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    LAST_STEP_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    BACKEND_SECONDS_FIELD_NUMBER: _ClassVar[int]
    LOSS_FN_FIELD_NUMBER: _ClassVar[int]
    LOSS_SUM_FIELD_NUMBER: _ClassVar[int]
    LOSS_MEAN_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    LOSS_TOKENS_FIELD_NUMBER: _ClassVar[int]
    EXAMPLES_FIELD_NUMBER: _ClassVar[int]
    RL_FIELD_NUMBER: _ClassVar[int]
    LEARNING_RATE_FIELD_NUMBER: _ClassVar[int]
    GRAD_NORM_FIELD_NUMBER: _ClassVar[int]
    TRAINING_RUN_ID_FIELD_NUMBER: _ClassVar[int]
    UPDATE_NORM_FIELD_NUMBER: _ClassVar[int]
    COST_USD_FIELD_NUMBER: _ClassVar[int]
    kind: _operations_pb2.OperationKind
    seq_id: int
    last_seq_id: int
    step: int
    last_step: int
    count: int
    time: _timestamp_pb2.Timestamp
    backend_seconds: float
    loss_fn: str
    loss_sum: float
    loss_mean: float
    tokens: int
    loss_tokens: int
    examples: int
    rl: RLStepMetrics
    learning_rate: float
    grad_norm: float
    training_run_id: str
    update_norm: float
    cost_usd: str
    def __init__(self, kind: _Optional[_Union[_operations_pb2.OperationKind, str]] = ..., seq_id: _Optional[int] = ..., last_seq_id: _Optional[int] = ..., step: _Optional[int] = ..., last_step: _Optional[int] = ..., count: _Optional[int] = ..., time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., backend_seconds: _Optional[float] = ..., loss_fn: _Optional[str] = ..., loss_sum: _Optional[float] = ..., loss_mean: _Optional[float] = ..., tokens: _Optional[int] = ..., loss_tokens: _Optional[int] = ..., examples: _Optional[int] = ..., rl: _Optional[_Union[RLStepMetrics, _Mapping]] = ..., learning_rate: _Optional[float] = ..., grad_norm: _Optional[float] = ..., training_run_id: _Optional[str] = ..., update_norm: _Optional[float] = ..., cost_usd: _Optional[str] = ...) -> None: ...

class RLStepMetrics(_message.Message):
    __slots__ = ("tokens", "kl_sample_train_k1", "kl_sample_train_k3", "ratio_mean", "ratio_std", "ratio_min", "ratio_max", "advantage_mean", "advantage_std", "zero_advantage_fraction", "clip_fraction")
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    KL_SAMPLE_TRAIN_K1_FIELD_NUMBER: _ClassVar[int]
    KL_SAMPLE_TRAIN_K3_FIELD_NUMBER: _ClassVar[int]
    RATIO_MEAN_FIELD_NUMBER: _ClassVar[int]
    RATIO_STD_FIELD_NUMBER: _ClassVar[int]
    RATIO_MIN_FIELD_NUMBER: _ClassVar[int]
    RATIO_MAX_FIELD_NUMBER: _ClassVar[int]
    ADVANTAGE_MEAN_FIELD_NUMBER: _ClassVar[int]
    ADVANTAGE_STD_FIELD_NUMBER: _ClassVar[int]
    ZERO_ADVANTAGE_FRACTION_FIELD_NUMBER: _ClassVar[int]
    CLIP_FRACTION_FIELD_NUMBER: _ClassVar[int]
    tokens: int
    kl_sample_train_k1: float
    kl_sample_train_k3: float
    ratio_mean: float
    ratio_std: float
    ratio_min: float
    ratio_max: float
    advantage_mean: float
    advantage_std: float
    zero_advantage_fraction: float
    clip_fraction: float
    def __init__(self, tokens: _Optional[int] = ..., kl_sample_train_k1: _Optional[float] = ..., kl_sample_train_k3: _Optional[float] = ..., ratio_mean: _Optional[float] = ..., ratio_std: _Optional[float] = ..., ratio_min: _Optional[float] = ..., ratio_max: _Optional[float] = ..., advantage_mean: _Optional[float] = ..., advantage_std: _Optional[float] = ..., zero_advantage_fraction: _Optional[float] = ..., clip_fraction: _Optional[float] = ...) -> None: ...

class ListTrainingRunsRequest(_message.Message):
    __slots__ = ("limit", "offset", "page_token", "project_id")
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    PROJECT_ID_FIELD_NUMBER: _ClassVar[int]
    limit: int
    offset: int
    page_token: str
    project_id: str
    def __init__(self, limit: _Optional[int] = ..., offset: _Optional[int] = ..., page_token: _Optional[str] = ..., project_id: _Optional[str] = ...) -> None: ...

class ListTrainingRunsResponse(_message.Message):
    __slots__ = ("training_runs", "total_count", "next_page_token")
    TRAINING_RUNS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_COUNT_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    training_runs: _containers.RepeatedCompositeFieldContainer[_resources_pb2.TrainingRun]
    total_count: int
    next_page_token: str
    def __init__(self, training_runs: _Optional[_Iterable[_Union[_resources_pb2.TrainingRun, _Mapping]]] = ..., total_count: _Optional[int] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class UnloadTrainingRunRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class ForwardBackwardRequest(_message.Message):
    __slots__ = ("training_run_id", "seq_id", "data", "loss_fn", "loss_fn_config", "forward_only")
    class LossFnConfigEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    TRAINING_RUN_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_ID_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    LOSS_FN_FIELD_NUMBER: _ClassVar[int]
    LOSS_FN_CONFIG_FIELD_NUMBER: _ClassVar[int]
    FORWARD_ONLY_FIELD_NUMBER: _ClassVar[int]
    training_run_id: str
    seq_id: int
    data: _containers.RepeatedCompositeFieldContainer[_types_pb2.Datum]
    loss_fn: str
    loss_fn_config: _containers.ScalarMap[str, float]
    forward_only: bool
    def __init__(self, training_run_id: _Optional[str] = ..., seq_id: _Optional[int] = ..., data: _Optional[_Iterable[_Union[_types_pb2.Datum, _Mapping]]] = ..., loss_fn: _Optional[str] = ..., loss_fn_config: _Optional[_Mapping[str, float]] = ..., forward_only: _Optional[bool] = ...) -> None: ...

class OptimStepRequest(_message.Message):
    __slots__ = ("training_run_id", "seq_id", "adam")
    TRAINING_RUN_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_ID_FIELD_NUMBER: _ClassVar[int]
    ADAM_FIELD_NUMBER: _ClassVar[int]
    training_run_id: str
    seq_id: int
    adam: _types_pb2.AdamParams
    def __init__(self, training_run_id: _Optional[str] = ..., seq_id: _Optional[int] = ..., adam: _Optional[_Union[_types_pb2.AdamParams, _Mapping]] = ...) -> None: ...

class SaveWeightsRequest(_message.Message):
    __slots__ = ("training_run_id", "seq_id", "kind", "name", "ttl_seconds", "overwrite", "sampler_seq_id", "inflight")
    TRAINING_RUN_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    OVERWRITE_FIELD_NUMBER: _ClassVar[int]
    SAMPLER_SEQ_ID_FIELD_NUMBER: _ClassVar[int]
    INFLIGHT_FIELD_NUMBER: _ClassVar[int]
    training_run_id: str
    seq_id: int
    kind: _resources_pb2.CheckpointKind
    name: str
    ttl_seconds: int
    overwrite: bool
    sampler_seq_id: int
    inflight: bool
    def __init__(self, training_run_id: _Optional[str] = ..., seq_id: _Optional[int] = ..., kind: _Optional[_Union[_resources_pb2.CheckpointKind, str]] = ..., name: _Optional[str] = ..., ttl_seconds: _Optional[int] = ..., overwrite: _Optional[bool] = ..., sampler_seq_id: _Optional[int] = ..., inflight: _Optional[bool] = ...) -> None: ...

class LoadWeightsRequest(_message.Message):
    __slots__ = ("training_run_id", "seq_id", "path", "with_optimizer", "weights_access_token")
    TRAINING_RUN_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    WITH_OPTIMIZER_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_ACCESS_TOKEN_FIELD_NUMBER: _ClassVar[int]
    training_run_id: str
    seq_id: int
    path: str
    with_optimizer: bool
    weights_access_token: str
    def __init__(self, training_run_id: _Optional[str] = ..., seq_id: _Optional[int] = ..., path: _Optional[str] = ..., with_optimizer: _Optional[bool] = ..., weights_access_token: _Optional[str] = ...) -> None: ...

class ListCheckpointsRequest(_message.Message):
    __slots__ = ("training_run_id", "limit", "offset", "page_token")
    TRAINING_RUN_ID_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    training_run_id: str
    limit: int
    offset: int
    page_token: str
    def __init__(self, training_run_id: _Optional[str] = ..., limit: _Optional[int] = ..., offset: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListCheckpointsResponse(_message.Message):
    __slots__ = ("checkpoints", "total_count", "next_page_token")
    CHECKPOINTS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_COUNT_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    checkpoints: _containers.RepeatedCompositeFieldContainer[_resources_pb2.Checkpoint]
    total_count: int
    next_page_token: str
    def __init__(self, checkpoints: _Optional[_Iterable[_Union[_resources_pb2.Checkpoint, _Mapping]]] = ..., total_count: _Optional[int] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class GetCheckpointRequest(_message.Message):
    __slots__ = ("path",)
    PATH_FIELD_NUMBER: _ClassVar[int]
    path: str
    def __init__(self, path: _Optional[str] = ...) -> None: ...

class DeleteCheckpointRequest(_message.Message):
    __slots__ = ("path",)
    PATH_FIELD_NUMBER: _ClassVar[int]
    path: str
    def __init__(self, path: _Optional[str] = ...) -> None: ...

class DeleteCheckpointResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SetCheckpointPublicRequest(_message.Message):
    __slots__ = ("path", "public")
    PATH_FIELD_NUMBER: _ClassVar[int]
    PUBLIC_FIELD_NUMBER: _ClassVar[int]
    path: str
    public: bool
    def __init__(self, path: _Optional[str] = ..., public: _Optional[bool] = ...) -> None: ...

class SetCheckpointTTLRequest(_message.Message):
    __slots__ = ("path", "ttl_seconds")
    PATH_FIELD_NUMBER: _ClassVar[int]
    TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    path: str
    ttl_seconds: int
    def __init__(self, path: _Optional[str] = ..., ttl_seconds: _Optional[int] = ...) -> None: ...

class GetCheckpointArchiveURLRequest(_message.Message):
    __slots__ = ("path",)
    PATH_FIELD_NUMBER: _ClassVar[int]
    path: str
    def __init__(self, path: _Optional[str] = ...) -> None: ...

class GetCheckpointArchiveURLResponse(_message.Message):
    __slots__ = ("url", "expire_time")
    URL_FIELD_NUMBER: _ClassVar[int]
    EXPIRE_TIME_FIELD_NUMBER: _ClassVar[int]
    url: str
    expire_time: _timestamp_pb2.Timestamp
    def __init__(self, url: _Optional[str] = ..., expire_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class GetCheckpointExportURLRequest(_message.Message):
    __slots__ = ("path", "format")
    PATH_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    path: str
    format: ExportFormat
    def __init__(self, path: _Optional[str] = ..., format: _Optional[_Union[ExportFormat, str]] = ...) -> None: ...

class GetCheckpointExportURLResponse(_message.Message):
    __slots__ = ("url", "expire_time")
    URL_FIELD_NUMBER: _ClassVar[int]
    EXPIRE_TIME_FIELD_NUMBER: _ClassVar[int]
    url: str
    expire_time: _timestamp_pb2.Timestamp
    def __init__(self, url: _Optional[str] = ..., expire_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class GetCheckpointFileURLsRequest(_message.Message):
    __slots__ = ("path",)
    PATH_FIELD_NUMBER: _ClassVar[int]
    path: str
    def __init__(self, path: _Optional[str] = ...) -> None: ...

class GetCheckpointFileURLsResponse(_message.Message):
    __slots__ = ("urls", "expire_time")
    class UrlsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    URLS_FIELD_NUMBER: _ClassVar[int]
    EXPIRE_TIME_FIELD_NUMBER: _ClassVar[int]
    urls: _containers.ScalarMap[str, str]
    expire_time: _timestamp_pb2.Timestamp
    def __init__(self, urls: _Optional[_Mapping[str, str]] = ..., expire_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class CreateSamplerRequest(_message.Message):
    __slots__ = ("session_id", "client_seq_id", "base_model", "model_path", "deployment")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_SEQ_ID_FIELD_NUMBER: _ClassVar[int]
    BASE_MODEL_FIELD_NUMBER: _ClassVar[int]
    MODEL_PATH_FIELD_NUMBER: _ClassVar[int]
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    client_seq_id: int
    base_model: str
    model_path: str
    deployment: str
    def __init__(self, session_id: _Optional[str] = ..., client_seq_id: _Optional[int] = ..., base_model: _Optional[str] = ..., model_path: _Optional[str] = ..., deployment: _Optional[str] = ...) -> None: ...

class GetSamplerRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class SampleRequest(_message.Message):
    __slots__ = ("sampler_id", "seq_id", "prompt", "num_samples", "params", "prompt_logprobs", "topk_prompt_logprobs", "base_model", "model_path", "prompt_logprobs_last_n", "target_prompt_tokens", "prompt_alt_tokens_k", "embed", "prompt_images")
    SAMPLER_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    NUM_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    TOPK_PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    BASE_MODEL_FIELD_NUMBER: _ClassVar[int]
    MODEL_PATH_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_LAST_N_FIELD_NUMBER: _ClassVar[int]
    TARGET_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_ALT_TOKENS_K_FIELD_NUMBER: _ClassVar[int]
    EMBED_FIELD_NUMBER: _ClassVar[int]
    PROMPT_IMAGES_FIELD_NUMBER: _ClassVar[int]
    sampler_id: str
    seq_id: int
    prompt: _containers.RepeatedScalarFieldContainer[int]
    num_samples: int
    params: _types_pb2.SamplingParams
    prompt_logprobs: bool
    topk_prompt_logprobs: int
    base_model: str
    model_path: str
    prompt_logprobs_last_n: int
    target_prompt_tokens: _types_pb2.TargetPromptTokens
    prompt_alt_tokens_k: int
    embed: bool
    prompt_images: _containers.RepeatedCompositeFieldContainer[_types_pb2.Image]
    def __init__(self, sampler_id: _Optional[str] = ..., seq_id: _Optional[int] = ..., prompt: _Optional[_Iterable[int]] = ..., num_samples: _Optional[int] = ..., params: _Optional[_Union[_types_pb2.SamplingParams, _Mapping]] = ..., prompt_logprobs: _Optional[bool] = ..., topk_prompt_logprobs: _Optional[int] = ..., base_model: _Optional[str] = ..., model_path: _Optional[str] = ..., prompt_logprobs_last_n: _Optional[int] = ..., target_prompt_tokens: _Optional[_Union[_types_pb2.TargetPromptTokens, _Mapping]] = ..., prompt_alt_tokens_k: _Optional[int] = ..., embed: _Optional[bool] = ..., prompt_images: _Optional[_Iterable[_Union[_types_pb2.Image, _Mapping]]] = ...) -> None: ...

class ListModelsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListModelsResponse(_message.Message):
    __slots__ = ("models",)
    MODELS_FIELD_NUMBER: _ClassVar[int]
    models: _containers.RepeatedCompositeFieldContainer[_types_pb2.ModelInfo]
    def __init__(self, models: _Optional[_Iterable[_Union[_types_pb2.ModelInfo, _Mapping]]] = ...) -> None: ...

class GetUsageRequest(_message.Message):
    __slots__ = ("start_time", "end_time")
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    END_TIME_FIELD_NUMBER: _ClassVar[int]
    start_time: _timestamp_pb2.Timestamp
    end_time: _timestamp_pb2.Timestamp
    def __init__(self, start_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., end_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class GetUsageResponse(_message.Message):
    __slots__ = ("buckets",)
    BUCKETS_FIELD_NUMBER: _ClassVar[int]
    buckets: _containers.RepeatedCompositeFieldContainer[UsageBucket]
    def __init__(self, buckets: _Optional[_Iterable[_Union[UsageBucket, _Mapping]]] = ...) -> None: ...

class UsageBucket(_message.Message):
    __slots__ = ("start_time", "end_time", "base_model", "session_id", "kind", "amount", "deployment", "cost_usd", "priced_amount", "key_id", "training_run_id")
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    END_TIME_FIELD_NUMBER: _ClassVar[int]
    BASE_MODEL_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    AMOUNT_FIELD_NUMBER: _ClassVar[int]
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    COST_USD_FIELD_NUMBER: _ClassVar[int]
    PRICED_AMOUNT_FIELD_NUMBER: _ClassVar[int]
    KEY_ID_FIELD_NUMBER: _ClassVar[int]
    TRAINING_RUN_ID_FIELD_NUMBER: _ClassVar[int]
    start_time: _timestamp_pb2.Timestamp
    end_time: _timestamp_pb2.Timestamp
    base_model: str
    session_id: str
    kind: UsageKind
    amount: int
    deployment: str
    cost_usd: str
    priced_amount: int
    key_id: str
    training_run_id: str
    def __init__(self, start_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., end_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., base_model: _Optional[str] = ..., session_id: _Optional[str] = ..., kind: _Optional[_Union[UsageKind, str]] = ..., amount: _Optional[int] = ..., deployment: _Optional[str] = ..., cost_usd: _Optional[str] = ..., priced_amount: _Optional[int] = ..., key_id: _Optional[str] = ..., training_run_id: _Optional[str] = ...) -> None: ...

class EstimateCostRequest(_message.Message):
    __slots__ = ("base_model", "steps", "batch_size", "example_tokens", "passes", "prompt_tokens", "group_size", "completion_tokens", "eval_requests", "eval_prompt_tokens", "usage")
    BASE_MODEL_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    EXAMPLE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PASSES_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    GROUP_SIZE_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    EVAL_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    EVAL_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    base_model: str
    steps: int
    batch_size: int
    example_tokens: _containers.RepeatedScalarFieldContainer[int]
    passes: int
    prompt_tokens: _containers.RepeatedScalarFieldContainer[int]
    group_size: int
    completion_tokens: int
    eval_requests: int
    eval_prompt_tokens: int
    usage: _containers.RepeatedCompositeFieldContainer[UsageEstimate]
    def __init__(self, base_model: _Optional[str] = ..., steps: _Optional[int] = ..., batch_size: _Optional[int] = ..., example_tokens: _Optional[_Iterable[int]] = ..., passes: _Optional[int] = ..., prompt_tokens: _Optional[_Iterable[int]] = ..., group_size: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., eval_requests: _Optional[int] = ..., eval_prompt_tokens: _Optional[int] = ..., usage: _Optional[_Iterable[_Union[UsageEstimate, _Mapping]]] = ...) -> None: ...

class EstimateCostResponse(_message.Message):
    __slots__ = ("usage", "total_usd", "price_version", "total_low_usd", "total_high_usd")
    USAGE_FIELD_NUMBER: _ClassVar[int]
    TOTAL_USD_FIELD_NUMBER: _ClassVar[int]
    PRICE_VERSION_FIELD_NUMBER: _ClassVar[int]
    TOTAL_LOW_USD_FIELD_NUMBER: _ClassVar[int]
    TOTAL_HIGH_USD_FIELD_NUMBER: _ClassVar[int]
    usage: _containers.RepeatedCompositeFieldContainer[UsageEstimate]
    total_usd: str
    price_version: str
    total_low_usd: str
    total_high_usd: str
    def __init__(self, usage: _Optional[_Iterable[_Union[UsageEstimate, _Mapping]]] = ..., total_usd: _Optional[str] = ..., price_version: _Optional[str] = ..., total_low_usd: _Optional[str] = ..., total_high_usd: _Optional[str] = ...) -> None: ...

class UsageEstimate(_message.Message):
    __slots__ = ("kind", "amount", "cost_usd", "amount_low", "amount_high", "cost_low_usd", "cost_high_usd")
    KIND_FIELD_NUMBER: _ClassVar[int]
    AMOUNT_FIELD_NUMBER: _ClassVar[int]
    COST_USD_FIELD_NUMBER: _ClassVar[int]
    AMOUNT_LOW_FIELD_NUMBER: _ClassVar[int]
    AMOUNT_HIGH_FIELD_NUMBER: _ClassVar[int]
    COST_LOW_USD_FIELD_NUMBER: _ClassVar[int]
    COST_HIGH_USD_FIELD_NUMBER: _ClassVar[int]
    kind: UsageKind
    amount: int
    cost_usd: str
    amount_low: int
    amount_high: int
    cost_low_usd: str
    cost_high_usd: str
    def __init__(self, kind: _Optional[_Union[UsageKind, str]] = ..., amount: _Optional[int] = ..., cost_usd: _Optional[str] = ..., amount_low: _Optional[int] = ..., amount_high: _Optional[int] = ..., cost_low_usd: _Optional[str] = ..., cost_high_usd: _Optional[str] = ...) -> None: ...

class GetWorkspaceRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Workspace(_message.Message):
    __slots__ = ("name", "limits", "use", "budgets", "key_budgets")
    NAME_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    USE_FIELD_NUMBER: _ClassVar[int]
    BUDGETS_FIELD_NUMBER: _ClassVar[int]
    KEY_BUDGETS_FIELD_NUMBER: _ClassVar[int]
    name: str
    limits: WorkspaceLimits
    use: WorkspaceUse
    budgets: _containers.RepeatedCompositeFieldContainer[WorkspaceBudget]
    key_budgets: _containers.RepeatedCompositeFieldContainer[WorkspaceBudget]
    def __init__(self, name: _Optional[str] = ..., limits: _Optional[_Union[WorkspaceLimits, _Mapping]] = ..., use: _Optional[_Union[WorkspaceUse, _Mapping]] = ..., budgets: _Optional[_Iterable[_Union[WorkspaceBudget, _Mapping]]] = ..., key_budgets: _Optional[_Iterable[_Union[WorkspaceBudget, _Mapping]]] = ...) -> None: ...

class WorkspaceBudget(_message.Message):
    __slots__ = ("name", "limit_usd", "spent_usd", "reserved_usd", "period", "alerts", "key_id")
    NAME_FIELD_NUMBER: _ClassVar[int]
    LIMIT_USD_FIELD_NUMBER: _ClassVar[int]
    SPENT_USD_FIELD_NUMBER: _ClassVar[int]
    RESERVED_USD_FIELD_NUMBER: _ClassVar[int]
    PERIOD_FIELD_NUMBER: _ClassVar[int]
    ALERTS_FIELD_NUMBER: _ClassVar[int]
    KEY_ID_FIELD_NUMBER: _ClassVar[int]
    name: str
    limit_usd: str
    spent_usd: str
    reserved_usd: str
    period: str
    alerts: _containers.RepeatedScalarFieldContainer[int]
    key_id: str
    def __init__(self, name: _Optional[str] = ..., limit_usd: _Optional[str] = ..., spent_usd: _Optional[str] = ..., reserved_usd: _Optional[str] = ..., period: _Optional[str] = ..., alerts: _Optional[_Iterable[int]] = ..., key_id: _Optional[str] = ...) -> None: ...

class WorkspaceLimits(_message.Message):
    __slots__ = ("models", "max_sequence_length", "max_lora_rank", "max_concurrent_runs", "max_queued_operations", "sampling_concurrency", "allowed_modalities", "allow_full_finetune")
    MODELS_FIELD_NUMBER: _ClassVar[int]
    MAX_SEQUENCE_LENGTH_FIELD_NUMBER: _ClassVar[int]
    MAX_LORA_RANK_FIELD_NUMBER: _ClassVar[int]
    MAX_CONCURRENT_RUNS_FIELD_NUMBER: _ClassVar[int]
    MAX_QUEUED_OPERATIONS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_CONCURRENCY_FIELD_NUMBER: _ClassVar[int]
    ALLOWED_MODALITIES_FIELD_NUMBER: _ClassVar[int]
    ALLOW_FULL_FINETUNE_FIELD_NUMBER: _ClassVar[int]
    models: _containers.RepeatedCompositeFieldContainer[_types_pb2.ModelInfo]
    max_sequence_length: int
    max_lora_rank: int
    max_concurrent_runs: int
    max_queued_operations: int
    sampling_concurrency: int
    allowed_modalities: _containers.RepeatedScalarFieldContainer[str]
    allow_full_finetune: bool
    def __init__(self, models: _Optional[_Iterable[_Union[_types_pb2.ModelInfo, _Mapping]]] = ..., max_sequence_length: _Optional[int] = ..., max_lora_rank: _Optional[int] = ..., max_concurrent_runs: _Optional[int] = ..., max_queued_operations: _Optional[int] = ..., sampling_concurrency: _Optional[int] = ..., allowed_modalities: _Optional[_Iterable[str]] = ..., allow_full_finetune: _Optional[bool] = ...) -> None: ...

class WorkspaceUse(_message.Message):
    __slots__ = ("live_runs", "queued_operations", "running_samples", "waiting_samples", "fairness")
    LIVE_RUNS_FIELD_NUMBER: _ClassVar[int]
    QUEUED_OPERATIONS_FIELD_NUMBER: _ClassVar[int]
    RUNNING_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    WAITING_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    FAIRNESS_FIELD_NUMBER: _ClassVar[int]
    live_runs: int
    queued_operations: int
    running_samples: int
    waiting_samples: int
    fairness: WorkspaceFairness
    def __init__(self, live_runs: _Optional[int] = ..., queued_operations: _Optional[int] = ..., running_samples: _Optional[int] = ..., waiting_samples: _Optional[int] = ..., fairness: _Optional[_Union[WorkspaceFairness, _Mapping]] = ...) -> None: ...

class WorkspaceFairness(_message.Message):
    __slots__ = ("operations", "wait_p50", "inflation_p99", "target", "breached")
    OPERATIONS_FIELD_NUMBER: _ClassVar[int]
    WAIT_P50_FIELD_NUMBER: _ClassVar[int]
    INFLATION_P99_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    BREACHED_FIELD_NUMBER: _ClassVar[int]
    operations: int
    wait_p50: _duration_pb2.Duration
    inflation_p99: float
    target: float
    breached: bool
    def __init__(self, operations: _Optional[int] = ..., wait_p50: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., inflation_p99: _Optional[float] = ..., target: _Optional[float] = ..., breached: _Optional[bool] = ...) -> None: ...
