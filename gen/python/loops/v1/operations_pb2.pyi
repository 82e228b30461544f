import datetime

from google.api import annotations_pb2 as _annotations_pb2
from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from loops.v1 import resources_pb2 as _resources_pb2
from loops.v1 import types_pb2 as _types_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class OperationKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OPERATION_KIND_UNSPECIFIED: _ClassVar[OperationKind]
    OPERATION_KIND_CREATE_TRAINING_RUN: _ClassVar[OperationKind]
    OPERATION_KIND_FORWARD: _ClassVar[OperationKind]
    OPERATION_KIND_FORWARD_BACKWARD: _ClassVar[OperationKind]
    OPERATION_KIND_OPTIM_STEP: _ClassVar[OperationKind]
    OPERATION_KIND_SAVE_WEIGHTS: _ClassVar[OperationKind]
    OPERATION_KIND_SAVE_WEIGHTS_FOR_SAMPLER: _ClassVar[OperationKind]
    OPERATION_KIND_LOAD_WEIGHTS: _ClassVar[OperationKind]
    OPERATION_KIND_SAMPLE: _ClassVar[OperationKind]
    OPERATION_KIND_UNLOAD_TRAINING_RUN: _ClassVar[OperationKind]

class OperationState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OPERATION_STATE_UNSPECIFIED: _ClassVar[OperationState]
    OPERATION_STATE_PENDING: _ClassVar[OperationState]
    OPERATION_STATE_RUNNING: _ClassVar[OperationState]
    OPERATION_STATE_SUCCEEDED: _ClassVar[OperationState]
    OPERATION_STATE_FAILED: _ClassVar[OperationState]
    OPERATION_STATE_CANCELLED: _ClassVar[OperationState]

class ErrorCategory(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ERROR_CATEGORY_UNSPECIFIED: _ClassVar[ErrorCategory]
    ERROR_CATEGORY_USER: _ClassVar[ErrorCategory]
    ERROR_CATEGORY_SERVER: _ClassVar[ErrorCategory]

class QueueState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    QUEUE_STATE_UNSPECIFIED: _ClassVar[QueueState]
    QUEUE_STATE_ACTIVE: _ClassVar[QueueState]
    QUEUE_STATE_PAUSED_CAPACITY: _ClassVar[QueueState]
    QUEUE_STATE_PAUSED_RATE_LIMIT: _ClassVar[QueueState]
OPERATION_KIND_UNSPECIFIED: OperationKind
OPERATION_KIND_CREATE_TRAINING_RUN: OperationKind
OPERATION_KIND_FORWARD: OperationKind
OPERATION_KIND_FORWARD_BACKWARD: OperationKind
OPERATION_KIND_OPTIM_STEP: OperationKind
OPERATION_KIND_SAVE_WEIGHTS: OperationKind
OPERATION_KIND_SAVE_WEIGHTS_FOR_SAMPLER: OperationKind
OPERATION_KIND_LOAD_WEIGHTS: OperationKind
OPERATION_KIND_SAMPLE: OperationKind
OPERATION_KIND_UNLOAD_TRAINING_RUN: OperationKind
OPERATION_STATE_UNSPECIFIED: OperationState
OPERATION_STATE_PENDING: OperationState
OPERATION_STATE_RUNNING: OperationState
OPERATION_STATE_SUCCEEDED: OperationState
OPERATION_STATE_FAILED: OperationState
OPERATION_STATE_CANCELLED: OperationState
ERROR_CATEGORY_UNSPECIFIED: ErrorCategory
ERROR_CATEGORY_USER: ErrorCategory
ERROR_CATEGORY_SERVER: ErrorCategory
QUEUE_STATE_UNSPECIFIED: QueueState
QUEUE_STATE_ACTIVE: QueueState
QUEUE_STATE_PAUSED_CAPACITY: QueueState
QUEUE_STATE_PAUSED_RATE_LIMIT: QueueState

class OperationError(_message.Message):
    __slots__ = ("code", "message", "category")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    CATEGORY_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    category: ErrorCategory
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ..., category: _Optional[_Union[ErrorCategory, str]] = ...) -> None: ...

class SaveWeightsResult(_message.Message):
    __slots__ = ("path", "sampler_id", "checkpoint")
    PATH_FIELD_NUMBER: _ClassVar[int]
    SAMPLER_ID_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    path: str
    sampler_id: str
    checkpoint: _resources_pb2.Checkpoint
    def __init__(self, path: _Optional[str] = ..., sampler_id: _Optional[str] = ..., checkpoint: _Optional[_Union[_resources_pb2.Checkpoint, _Mapping]] = ...) -> None: ...

class LoadWeightsResult(_message.Message):
    __slots__ = ("path", "training_run_id")
    PATH_FIELD_NUMBER: _ClassVar[int]
    TRAINING_RUN_ID_FIELD_NUMBER: _ClassVar[int]
    path: str
    training_run_id: str
    def __init__(self, path: _Optional[str] = ..., training_run_id: _Optional[str] = ...) -> None: ...

class UnloadTrainingRunResult(_message.Message):
    __slots__ = ("training_run_id",)
    TRAINING_RUN_ID_FIELD_NUMBER: _ClassVar[int]
    training_run_id: str
    def __init__(self, training_run_id: _Optional[str] = ...) -> None: ...

class Operation(_message.Message):
    __slots__ = ("id", "kind", "state", "training_run_id", "sampler_id", "seq_id", "create_time", "done_time", "error", "training_run", "forward_backward", "optim_step", "save_weights", "load_weights", "sample", "unload", "queue", "cancel_time", "timeline", "cost")
    ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    TRAINING_RUN_ID_FIELD_NUMBER: _ClassVar[int]
    SAMPLER_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_ID_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    DONE_TIME_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    TRAINING_RUN_FIELD_NUMBER: _ClassVar[int]
    FORWARD_BACKWARD_FIELD_NUMBER: _ClassVar[int]
    OPTIM_STEP_FIELD_NUMBER: _ClassVar[int]
    SAVE_WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    LOAD_WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_FIELD_NUMBER: _ClassVar[int]
    UNLOAD_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    CANCEL_TIME_FIELD_NUMBER: _ClassVar[int]
    TIMELINE_FIELD_NUMBER: _ClassVar[int]
    COST_FIELD_NUMBER: _ClassVar[int]
    id: str
    kind: OperationKind
    state: OperationState
    training_run_id: str
    sampler_id: str
    seq_id: int
    create_time: _timestamp_pb2.Timestamp
    done_time: _timestamp_pb2.Timestamp
    error: OperationError
    training_run: _resources_pb2.TrainingRun
    forward_backward: _types_pb2.ForwardBackwardResult
    optim_step: _types_pb2.OptimStepResult
    save_weights: SaveWeightsResult
    load_weights: LoadWeightsResult
    sample: _types_pb2.SampleResult
    unload: UnloadTrainingRunResult
    queue: QueueStatus
    cancel_time: _timestamp_pb2.Timestamp
    timeline: OperationTimeline
    cost: OperationCost
    def __init__(self, id: _Optional[str] = ..., kind: _Optional[_Union[OperationKind, str]] = ..., state: _Optional[_Union[OperationState, str]] = ..., training_run_id: _Optional[str] = ..., sampler_id: _Optional[str] = ..., seq_id: _Optional[int] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., done_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., error: _Optional[_Union[OperationError, _Mapping]] = ..., training_run: _Optional[_Union[_resources_pb2.TrainingRun, _Mapping]] = ..., forward_backward: _Optional[_Union[_types_pb2.ForwardBackwardResult, _Mapping]] = ..., optim_step: _Optional[_Union[_types_pb2.OptimStepResult, _Mapping]] = ..., save_weights: _Optional[_Union[SaveWeightsResult, _Mapping]] = ..., load_weights: _Optional[_Union[LoadWeightsResult, _Mapping]] = ..., sample: _Optional[_Union[_types_pb2.SampleResult, _Mapping]] = ..., unload: _Optional[_Union[UnloadTrainingRunResult, _Mapping]] = ..., queue: _Optional[_Union[QueueStatus, _Mapping]] = ..., cancel_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., timeline: _Optional[_Union[OperationTimeline, _Mapping]] = ..., cost: _Optional[_Union[OperationCost, _Mapping]] = ...) -> None: ...

class OperationCost(_message.Message):
    __slots__ = ("usd", "price_versions")
    USD_FIELD_NUMBER: _ClassVar[int]
    PRICE_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    usd: str
    price_versions: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, usd: _Optional[str] = ..., price_versions: _Optional[_Iterable[str]] = ...) -> None: ...

class OperationTimeline(_message.Message):
    __slots__ = ("start_time", "backend_start_time", "backend_end_time", "batch_items", "pieces", "persist_time", "retrieve_time")
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    BACKEND_START_TIME_FIELD_NUMBER: _ClassVar[int]
    BACKEND_END_TIME_FIELD_NUMBER: _ClassVar[int]
    BATCH_ITEMS_FIELD_NUMBER: _ClassVar[int]
    PIECES_FIELD_NUMBER: _ClassVar[int]
    PERSIST_TIME_FIELD_NUMBER: _ClassVar[int]
    RETRIEVE_TIME_FIELD_NUMBER: _ClassVar[int]
    start_time: _timestamp_pb2.Timestamp
    backend_start_time: _timestamp_pb2.Timestamp
    backend_end_time: _timestamp_pb2.Timestamp
    batch_items: int
    pieces: int
    persist_time: _timestamp_pb2.Timestamp
    retrieve_time: _timestamp_pb2.Timestamp
    def __init__(self, start_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., backend_start_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., backend_end_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., batch_items: _Optional[int] = ..., pieces: _Optional[int] = ..., persist_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., retrieve_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class QueueStatus(_message.Message):
    __slots__ = ("state", "reason", "position", "estimated_wait")
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    ESTIMATED_WAIT_FIELD_NUMBER: _ClassVar[int]
    state: QueueState
    reason: str
    position: int
    estimated_wait: _duration_pb2.Duration
    def __init__(self, state: _Optional[_Union[QueueState, str]] = ..., reason: _Optional[str] = ..., position: _Optional[int] = ..., estimated_wait: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class GetOperationRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class WaitOperationRequest(_message.Message):
    __slots__ = ("id", "timeout")
    ID_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    id: str
    timeout: _duration_pb2.Duration
    def __init__(self, id: _Optional[str] = ..., timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class CancelOperationRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class BatchGetOperationsRequest(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, ids: _Optional[_Iterable[str]] = ...) -> None: ...

class BatchGetOperationsResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[OperationLookup]
    def __init__(self, results: _Optional[_Iterable[_Union[OperationLookup, _Mapping]]] = ...) -> None: ...

class OperationLookup(_message.Message):
    __slots__ = ("id", "operation", "error")
    ID_FIELD_NUMBER: _ClassVar[int]
    OPERATION_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    id: str
    operation: Operation
    error: OperationError
    def __init__(self, id: _Optional[str] = ..., operation: _Optional[_Union[Operation, _Mapping]] = ..., error: _Optional[_Union[OperationError, _Mapping]] = ...) -> None: ...
