from loops.v1 import types_pb2 as _types_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GetCapabilitiesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetCapabilitiesResponse(_message.Message):
    __slots__ = ("models", "loss_functions", "max_adapters", "implementation", "saves_gradients", "checkpoint_urls")
    MODELS_FIELD_NUMBER: _ClassVar[int]
    LOSS_FUNCTIONS_FIELD_NUMBER: _ClassVar[int]
    MAX_ADAPTERS_FIELD_NUMBER: _ClassVar[int]
    IMPLEMENTATION_FIELD_NUMBER: _ClassVar[int]
    SAVES_GRADIENTS_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_URLS_FIELD_NUMBER: _ClassVar[int]
    models: _containers.RepeatedCompositeFieldContainer[_types_pb2.ModelInfo]
    loss_functions: _containers.RepeatedScalarFieldContainer[str]
    max_adapters: int
    implementation: str
    saves_gradients: bool
    checkpoint_urls: bool
    def __init__(self, models: _Optional[_Iterable[_Union[_types_pb2.ModelInfo, _Mapping]]] = ..., loss_functions: _Optional[_Iterable[str]] = ..., max_adapters: _Optional[int] = ..., implementation: _Optional[str] = ..., saves_gradients: _Optional[bool] = ..., checkpoint_urls: _Optional[bool] = ...) -> None: ...

class FileURL(_message.Message):
    __slots__ = ("name", "url", "size", "sha256")
    NAME_FIELD_NUMBER: _ClassVar[int]
    URL_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    name: str
    url: str
    size: int
    sha256: str
    def __init__(self, name: _Optional[str] = ..., url: _Optional[str] = ..., size: _Optional[int] = ..., sha256: _Optional[str] = ...) -> None: ...

class CreateAdapterRequest(_message.Message):
    __slots__ = ("adapter_id", "base_model", "lora", "pool")
    ADAPTER_ID_FIELD_NUMBER: _ClassVar[int]
    BASE_MODEL_FIELD_NUMBER: _ClassVar[int]
    LORA_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    adapter_id: str
    base_model: str
    lora: _types_pb2.LoraConfig
    pool: str
    def __init__(self, adapter_id: _Optional[str] = ..., base_model: _Optional[str] = ..., lora: _Optional[_Union[_types_pb2.LoraConfig, _Mapping]] = ..., pool: _Optional[str] = ...) -> None: ...

class CreateAdapterResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DeleteAdapterRequest(_message.Message):
    __slots__ = ("adapter_id",)
    ADAPTER_ID_FIELD_NUMBER: _ClassVar[int]
    adapter_id: str
    def __init__(self, adapter_id: _Optional[str] = ...) -> None: ...

class DeleteAdapterResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ForwardBackwardItem(_message.Message):
    __slots__ = ("adapter_id", "data", "loss_fn", "loss_fn_config", "forward_only")
    class LossFnConfigEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    ADAPTER_ID_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    LOSS_FN_FIELD_NUMBER: _ClassVar[int]
    LOSS_FN_CONFIG_FIELD_NUMBER: _ClassVar[int]
    FORWARD_ONLY_FIELD_NUMBER: _ClassVar[int]
    adapter_id: str
    data: _containers.RepeatedCompositeFieldContainer[_types_pb2.Datum]
    loss_fn: str
    loss_fn_config: _containers.ScalarMap[str, float]
    forward_only: bool
    def __init__(self, adapter_id: _Optional[str] = ..., data: _Optional[_Iterable[_Union[_types_pb2.Datum, _Mapping]]] = ..., loss_fn: _Optional[str] = ..., loss_fn_config: _Optional[_Mapping[str, float]] = ..., forward_only: _Optional[bool] = ...) -> None: ...

class ForwardBackwardRequest(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[ForwardBackwardItem]
    def __init__(self, items: _Optional[_Iterable[_Union[ForwardBackwardItem, _Mapping]]] = ...) -> None: ...

class ItemError(_message.Message):
    __slots__ = ("code", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class ForwardBackwardItemResult(_message.Message):
    __slots__ = ("result", "error")
    RESULT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    result: _types_pb2.ForwardBackwardResult
    error: ItemError
    def __init__(self, result: _Optional[_Union[_types_pb2.ForwardBackwardResult, _Mapping]] = ..., error: _Optional[_Union[ItemError, _Mapping]] = ...) -> None: ...

class ForwardBackwardResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[ForwardBackwardItemResult]
    def __init__(self, results: _Optional[_Iterable[_Union[ForwardBackwardItemResult, _Mapping]]] = ...) -> None: ...

class OptimStepRequest(_message.Message):
    __slots__ = ("adapter_id", "adam")
    ADAPTER_ID_FIELD_NUMBER: _ClassVar[int]
    ADAM_FIELD_NUMBER: _ClassVar[int]
    adapter_id: str
    adam: _types_pb2.AdamParams
    def __init__(self, adapter_id: _Optional[str] = ..., adam: _Optional[_Union[_types_pb2.AdamParams, _Mapping]] = ...) -> None: ...

class OptimStepResponse(_message.Message):
    __slots__ = ("result",)
    RESULT_FIELD_NUMBER: _ClassVar[int]
    result: _types_pb2.OptimStepResult
    def __init__(self, result: _Optional[_Union[_types_pb2.OptimStepResult, _Mapping]] = ...) -> None: ...

class SaveAdapterRequest(_message.Message):
    __slots__ = ("adapter_id", "dir", "include_optimizer", "include_gradients", "upload")
    ADAPTER_ID_FIELD_NUMBER: _ClassVar[int]
    DIR_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_OPTIMIZER_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_GRADIENTS_FIELD_NUMBER: _ClassVar[int]
    UPLOAD_FIELD_NUMBER: _ClassVar[int]
    adapter_id: str
    dir: str
    include_optimizer: bool
    include_gradients: bool
    upload: _containers.RepeatedCompositeFieldContainer[FileURL]
    def __init__(self, adapter_id: _Optional[str] = ..., dir: _Optional[str] = ..., include_optimizer: _Optional[bool] = ..., include_gradients: _Optional[bool] = ..., upload: _Optional[_Iterable[_Union[FileURL, _Mapping]]] = ...) -> None: ...

class SaveAdapterResponse(_message.Message):
    __slots__ = ("size_bytes", "files")
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    size_bytes: int
    files: _containers.RepeatedCompositeFieldContainer[FileURL]
    def __init__(self, size_bytes: _Optional[int] = ..., files: _Optional[_Iterable[_Union[FileURL, _Mapping]]] = ...) -> None: ...

class LoadAdapterRequest(_message.Message):
    __slots__ = ("adapter_id", "dir", "load_optimizer", "load_gradients", "download")
    ADAPTER_ID_FIELD_NUMBER: _ClassVar[int]
    DIR_FIELD_NUMBER: _ClassVar[int]
    LOAD_OPTIMIZER_FIELD_NUMBER: _ClassVar[int]
    LOAD_GRADIENTS_FIELD_NUMBER: _ClassVar[int]
    DOWNLOAD_FIELD_NUMBER: _ClassVar[int]
    adapter_id: str
    dir: str
    load_optimizer: bool
    load_gradients: bool
    download: _containers.RepeatedCompositeFieldContainer[FileURL]
    def __init__(self, adapter_id: _Optional[str] = ..., dir: _Optional[str] = ..., load_optimizer: _Optional[bool] = ..., load_gradients: _Optional[bool] = ..., download: _Optional[_Iterable[_Union[FileURL, _Mapping]]] = ...) -> None: ...

class LoadAdapterResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SampleRequest(_message.Message):
    __slots__ = ("base_model", "adapter_dir", "prompt", "num_samples", "params", "prompt_logprobs", "topk_prompt_logprobs", "adapter_files", "pool", "workspace", "target_prompt_tokens", "prompt_alt_tokens_k", "embed", "prompt_images")
    BASE_MODEL_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_DIR_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    NUM_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    TOPK_PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_FILES_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    WORKSPACE_FIELD_NUMBER: _ClassVar[int]
    TARGET_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_ALT_TOKENS_K_FIELD_NUMBER: _ClassVar[int]
    EMBED_FIELD_NUMBER: _ClassVar[int]
    PROMPT_IMAGES_FIELD_NUMBER: _ClassVar[int]
    base_model: str
    adapter_dir: str
    prompt: _containers.RepeatedScalarFieldContainer[int]
    num_samples: int
    params: _types_pb2.SamplingParams
    prompt_logprobs: bool
    topk_prompt_logprobs: int
    adapter_files: _containers.RepeatedCompositeFieldContainer[FileURL]
    pool: str
    workspace: str
    target_prompt_tokens: _types_pb2.TargetPromptTokens
    prompt_alt_tokens_k: int
    embed: bool
    prompt_images: _containers.RepeatedCompositeFieldContainer[_types_pb2.Image]
    def __init__(self, base_model: _Optional[str] = ..., adapter_dir: _Optional[str] = ..., prompt: _Optional[_Iterable[int]] = ..., num_samples: _Optional[int] = ..., params: _Optional[_Union[_types_pb2.SamplingParams, _Mapping]] = ..., prompt_logprobs: _Optional[bool] = ..., topk_prompt_logprobs: _Optional[int] = ..., adapter_files: _Optional[_Iterable[_Union[FileURL, _Mapping]]] = ..., pool: _Optional[str] = ..., workspace: _Optional[str] = ..., target_prompt_tokens: _Optional[_Union[_types_pb2.TargetPromptTokens, _Mapping]] = ..., prompt_alt_tokens_k: _Optional[int] = ..., embed: _Optional[bool] = ..., prompt_images: _Optional[_Iterable[_Union[_types_pb2.Image, _Mapping]]] = ...) -> None: ...

class SampleResponse(_message.Message):
    __slots__ = ("result",)
    RESULT_FIELD_NUMBER: _ClassVar[int]
    result: _types_pb2.SampleResult
    def __init__(self, result: _Optional[_Union[_types_pb2.SampleResult, _Mapping]] = ...) -> None: ...

class StreamSampleRequest(_message.Message):
    __slots__ = ("request",)
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    request: SampleRequest
    def __init__(self, request: _Optional[_Union[SampleRequest, _Mapping]] = ...) -> None: ...

class StreamSampleResponse(_message.Message):
    __slots__ = ("token", "response")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    token: SampledToken
    response: SampleResponse
    def __init__(self, token: _Optional[_Union[SampledToken, _Mapping]] = ..., response: _Optional[_Union[SampleResponse, _Mapping]] = ...) -> None: ...

class SampledToken(_message.Message):
    __slots__ = ("sequence", "token", "logprob", "top_tokens", "top_logprobs")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    TOP_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    token: int
    logprob: float
    top_tokens: _containers.RepeatedScalarFieldContainer[int]
    top_logprobs: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, sequence: _Optional[int] = ..., token: _Optional[int] = ..., logprob: _Optional[float] = ..., top_tokens: _Optional[_Iterable[int]] = ..., top_logprobs: _Optional[_Iterable[float]] = ...) -> None: ...
