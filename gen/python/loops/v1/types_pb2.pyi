from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Dtype(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DTYPE_UNSPECIFIED: _ClassVar[Dtype]
    DTYPE_FLOAT32: _ClassVar[Dtype]
    DTYPE_INT64: _ClassVar[Dtype]

class StopReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STOP_REASON_UNSPECIFIED: _ClassVar[StopReason]
    STOP_REASON_STOP: _ClassVar[StopReason]
    STOP_REASON_LENGTH: _ClassVar[StopReason]
DTYPE_UNSPECIFIED: Dtype
DTYPE_FLOAT32: Dtype
DTYPE_INT64: Dtype
STOP_REASON_UNSPECIFIED: StopReason
STOP_REASON_STOP: StopReason
STOP_REASON_LENGTH: StopReason

class Tensor(_message.Message):
    __slots__ = ("dtype", "shape", "float32_data", "int64_data")
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    FLOAT32_DATA_FIELD_NUMBER: _ClassVar[int]
    INT64_DATA_FIELD_NUMBER: _ClassVar[int]
    dtype: Dtype
    shape: _containers.RepeatedScalarFieldContainer[int]
    float32_data: _containers.RepeatedScalarFieldContainer[float]
    int64_data: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, dtype: _Optional[_Union[Dtype, str]] = ..., shape: _Optional[_Iterable[int]] = ..., float32_data: _Optional[_Iterable[float]] = ..., int64_data: _Optional[_Iterable[int]] = ...) -> None: ...

class Datum(_message.Message):
    __slots__ = ("tokens", "loss_fn_inputs", "images")
    class LossFnInputsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Tensor
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Tensor, _Mapping]] = ...) -> None: ...
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    LOSS_FN_INPUTS_FIELD_NUMBER: _ClassVar[int]
    IMAGES_FIELD_NUMBER: _ClassVar[int]
    tokens: _containers.RepeatedScalarFieldContainer[int]
    loss_fn_inputs: _containers.MessageMap[str, Tensor]
    images: _containers.RepeatedCompositeFieldContainer[Image]
    def __init__(self, tokens: _Optional[_Iterable[int]] = ..., loss_fn_inputs: _Optional[_Mapping[str, Tensor]] = ..., images: _Optional[_Iterable[_Union[Image, _Mapping]]] = ...) -> None: ...

class Image(_message.Message):
    __slots__ = ("data", "format", "offset", "tokens", "width", "height")
    DATA_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    format: str
    offset: int
    tokens: int
    width: int
    height: int
    def __init__(self, data: _Optional[bytes] = ..., format: _Optional[str] = ..., offset: _Optional[int] = ..., tokens: _Optional[int] = ..., width: _Optional[int] = ..., height: _Optional[int] = ...) -> None: ...

class VisionInfo(_message.Message):
    __slots__ = ("patch_size", "merge_size", "min_pixels", "max_pixels", "image_token_id")
    PATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    MERGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    MIN_PIXELS_FIELD_NUMBER: _ClassVar[int]
    MAX_PIXELS_FIELD_NUMBER: _ClassVar[int]
    IMAGE_TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    patch_size: int
    merge_size: int
    min_pixels: int
    max_pixels: int
    image_token_id: int
    def __init__(self, patch_size: _Optional[int] = ..., merge_size: _Optional[int] = ..., min_pixels: _Optional[int] = ..., max_pixels: _Optional[int] = ..., image_token_id: _Optional[int] = ...) -> None: ...

class LoraConfig(_message.Message):
    __slots__ = ("rank", "seed", "train_attn", "train_mlp", "train_unembed")
    RANK_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    TRAIN_ATTN_FIELD_NUMBER: _ClassVar[int]
    TRAIN_MLP_FIELD_NUMBER: _ClassVar[int]
    TRAIN_UNEMBED_FIELD_NUMBER: _ClassVar[int]
    rank: int
    seed: int
    train_attn: bool
    train_mlp: bool
    train_unembed: bool
    def __init__(self, rank: _Optional[int] = ..., seed: _Optional[int] = ..., train_attn: _Optional[bool] = ..., train_mlp: _Optional[bool] = ..., train_unembed: _Optional[bool] = ...) -> None: ...

class AdamParams(_message.Message):
    __slots__ = ("learning_rate", "beta1", "beta2", "eps", "weight_decay", "grad_clip_norm")
    LEARNING_RATE_FIELD_NUMBER: _ClassVar[int]
    BETA1_FIELD_NUMBER: _ClassVar[int]
    BETA2_FIELD_NUMBER: _ClassVar[int]
    EPS_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_DECAY_FIELD_NUMBER: _ClassVar[int]
    GRAD_CLIP_NORM_FIELD_NUMBER: _ClassVar[int]
    learning_rate: float
    beta1: float
    beta2: float
    eps: float
    weight_decay: float
    grad_clip_norm: float
    def __init__(self, learning_rate: _Optional[float] = ..., beta1: _Optional[float] = ..., beta2: _Optional[float] = ..., eps: _Optional[float] = ..., weight_decay: _Optional[float] = ..., grad_clip_norm: _Optional[float] = ...) -> None: ...

class SamplingParams(_message.Message):
    __slots__ = ("max_tokens", "temperature", "top_k", "top_p", "seed", "stop_strings", "stop_tokens", "top_logprobs", "logit_bias", "presence_penalty", "frequency_penalty", "min_p", "response_format")
    class LogitBiasEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: float
        def __init__(self, key: _Optional[int] = ..., value: _Optional[float] = ...) -> None: ...
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    STOP_STRINGS_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    LOGIT_BIAS_FIELD_NUMBER: _ClassVar[int]
    PRESENCE_PENALTY_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_PENALTY_FIELD_NUMBER: _ClassVar[int]
    MIN_P_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FORMAT_FIELD_NUMBER: _ClassVar[int]
    max_tokens: int
    temperature: float
    top_k: int
    top_p: float
    seed: int
    stop_strings: _containers.RepeatedScalarFieldContainer[str]
    stop_tokens: _containers.RepeatedScalarFieldContainer[int]
    top_logprobs: int
    logit_bias: _containers.ScalarMap[int, float]
    presence_penalty: float
    frequency_penalty: float
    min_p: float
    response_format: ResponseFormat
    def __init__(self, max_tokens: _Optional[int] = ..., temperature: _Optional[float] = ..., top_k: _Optional[int] = ..., top_p: _Optional[float] = ..., seed: _Optional[int] = ..., stop_strings: _Optional[_Iterable[str]] = ..., stop_tokens: _Optional[_Iterable[int]] = ..., top_logprobs: _Optional[int] = ..., logit_bias: _Optional[_Mapping[int, float]] = ..., presence_penalty: _Optional[float] = ..., frequency_penalty: _Optional[float] = ..., min_p: _Optional[float] = ..., response_format: _Optional[_Union[ResponseFormat, _Mapping]] = ...) -> None: ...

class ResponseFormat(_message.Message):
    __slots__ = ("type", "json_schema")
    class Type(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        TYPE_UNSPECIFIED: _ClassVar[ResponseFormat.Type]
        TYPE_TEXT: _ClassVar[ResponseFormat.Type]
        TYPE_JSON_OBJECT: _ClassVar[ResponseFormat.Type]
        TYPE_JSON_SCHEMA: _ClassVar[ResponseFormat.Type]
    TYPE_UNSPECIFIED: ResponseFormat.Type
    TYPE_TEXT: ResponseFormat.Type
    TYPE_JSON_OBJECT: ResponseFormat.Type
    TYPE_JSON_SCHEMA: ResponseFormat.Type
    TYPE_FIELD_NUMBER: _ClassVar[int]
    JSON_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    type: ResponseFormat.Type
    json_schema: str
    def __init__(self, type: _Optional[_Union[ResponseFormat.Type, str]] = ..., json_schema: _Optional[str] = ...) -> None: ...

class SampledSequence(_message.Message):
    __slots__ = ("tokens", "logprobs", "stop_reason", "top_logprobs")
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    STOP_REASON_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    tokens: _containers.RepeatedScalarFieldContainer[int]
    logprobs: _containers.RepeatedScalarFieldContainer[float]
    stop_reason: StopReason
    top_logprobs: TopKLogprobs
    def __init__(self, tokens: _Optional[_Iterable[int]] = ..., logprobs: _Optional[_Iterable[float]] = ..., stop_reason: _Optional[_Union[StopReason, str]] = ..., top_logprobs: _Optional[_Union[TopKLogprobs, _Mapping]] = ...) -> None: ...

class TopKLogprobs(_message.Message):
    __slots__ = ("k", "length", "token_ids", "logprobs")
    K_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    k: int
    length: int
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    logprobs: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, k: _Optional[int] = ..., length: _Optional[int] = ..., token_ids: _Optional[_Iterable[int]] = ..., logprobs: _Optional[_Iterable[float]] = ...) -> None: ...

class DatumOutput(_message.Message):
    __slots__ = ("outputs",)
    class OutputsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Tensor
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Tensor, _Mapping]] = ...) -> None: ...
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    outputs: _containers.MessageMap[str, Tensor]
    def __init__(self, outputs: _Optional[_Mapping[str, Tensor]] = ...) -> None: ...

class ForwardBackwardResult(_message.Message):
    __slots__ = ("outputs", "metrics")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    outputs: _containers.RepeatedCompositeFieldContainer[DatumOutput]
    metrics: _containers.ScalarMap[str, float]
    def __init__(self, outputs: _Optional[_Iterable[_Union[DatumOutput, _Mapping]]] = ..., metrics: _Optional[_Mapping[str, float]] = ...) -> None: ...

class OptimStepResult(_message.Message):
    __slots__ = ("metrics",)
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    METRICS_FIELD_NUMBER: _ClassVar[int]
    metrics: _containers.ScalarMap[str, float]
    def __init__(self, metrics: _Optional[_Mapping[str, float]] = ...) -> None: ...

class SampleResult(_message.Message):
    __slots__ = ("sequences", "prompt_logprobs", "topk_prompt_logprobs", "target_prompt_logprobs", "prompt_alt_tokens", "model_path", "embedding", "prompt_cached_tokens")
    SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    TOPK_PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    TARGET_PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_ALT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MODEL_PATH_FIELD_NUMBER: _ClassVar[int]
    EMBEDDING_FIELD_NUMBER: _ClassVar[int]
    PROMPT_CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    sequences: _containers.RepeatedCompositeFieldContainer[SampledSequence]
    prompt_logprobs: _containers.RepeatedScalarFieldContainer[float]
    topk_prompt_logprobs: TopKLogprobs
    target_prompt_logprobs: TargetPromptLogprobs
    prompt_alt_tokens: PromptAltTokens
    model_path: str
    embedding: _containers.RepeatedScalarFieldContainer[float]
    prompt_cached_tokens: int
    def __init__(self, sequences: _Optional[_Iterable[_Union[SampledSequence, _Mapping]]] = ..., prompt_logprobs: _Optional[_Iterable[float]] = ..., topk_prompt_logprobs: _Optional[_Union[TopKLogprobs, _Mapping]] = ..., target_prompt_logprobs: _Optional[_Union[TargetPromptLogprobs, _Mapping]] = ..., prompt_alt_tokens: _Optional[_Union[PromptAltTokens, _Mapping]] = ..., model_path: _Optional[str] = ..., embedding: _Optional[_Iterable[float]] = ..., prompt_cached_tokens: _Optional[int] = ...) -> None: ...

class TargetPromptTokens(_message.Message):
    __slots__ = ("k", "token_ids", "sparse")
    K_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SPARSE_FIELD_NUMBER: _ClassVar[int]
    k: int
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    sparse: bool
    def __init__(self, k: _Optional[int] = ..., token_ids: _Optional[_Iterable[int]] = ..., sparse: _Optional[bool] = ...) -> None: ...

class TargetPromptLogprobs(_message.Message):
    __slots__ = ("k", "logprobs", "sparse")
    K_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    SPARSE_FIELD_NUMBER: _ClassVar[int]
    k: int
    logprobs: _containers.RepeatedScalarFieldContainer[float]
    sparse: bool
    def __init__(self, k: _Optional[int] = ..., logprobs: _Optional[_Iterable[float]] = ..., sparse: _Optional[bool] = ...) -> None: ...

class PromptAltTokens(_message.Message):
    __slots__ = ("k", "token_ids", "logprobs")
    K_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    k: int
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    logprobs: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, k: _Optional[int] = ..., token_ids: _Optional[_Iterable[int]] = ..., logprobs: _Optional[_Iterable[float]] = ...) -> None: ...

class ModelInfo(_message.Message):
    __slots__ = ("name", "max_sequence_length", "vocab_size", "architecture", "tokenizer_id", "max_lora_rank", "backend", "hidden_size", "revision", "family", "publisher", "renderer", "lora_targets", "modalities", "vision", "tied_embeddings", "language_model_prefix", "devices_per_replica", "parameter_count", "weight_dtype", "num_layers", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim", "lora_parameters_per_rank", "device_memory_bytes", "replica_bytes", "logits_chunk_elements", "full_finetune", "trainable", "sampleable", "availability")
    NAME_FIELD_NUMBER: _ClassVar[int]
    MAX_SEQUENCE_LENGTH_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    ARCHITECTURE_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_LORA_RANK_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    HIDDEN_SIZE_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    FAMILY_FIELD_NUMBER: _ClassVar[int]
    PUBLISHER_FIELD_NUMBER: _ClassVar[int]
    RENDERER_FIELD_NUMBER: _ClassVar[int]
    LORA_TARGETS_FIELD_NUMBER: _ClassVar[int]
    MODALITIES_FIELD_NUMBER: _ClassVar[int]
    VISION_FIELD_NUMBER: _ClassVar[int]
    TIED_EMBEDDINGS_FIELD_NUMBER: _ClassVar[int]
    LANGUAGE_MODEL_PREFIX_FIELD_NUMBER: _ClassVar[int]
    DEVICES_PER_REPLICA_FIELD_NUMBER: _ClassVar[int]
    PARAMETER_COUNT_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_DTYPE_FIELD_NUMBER: _ClassVar[int]
    NUM_LAYERS_FIELD_NUMBER: _ClassVar[int]
    INTERMEDIATE_SIZE_FIELD_NUMBER: _ClassVar[int]
    NUM_ATTENTION_HEADS_FIELD_NUMBER: _ClassVar[int]
    NUM_KEY_VALUE_HEADS_FIELD_NUMBER: _ClassVar[int]
    HEAD_DIM_FIELD_NUMBER: _ClassVar[int]
    LORA_PARAMETERS_PER_RANK_FIELD_NUMBER: _ClassVar[int]
    DEVICE_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    REPLICA_BYTES_FIELD_NUMBER: _ClassVar[int]
    LOGITS_CHUNK_ELEMENTS_FIELD_NUMBER: _ClassVar[int]
    FULL_FINETUNE_FIELD_NUMBER: _ClassVar[int]
    TRAINABLE_FIELD_NUMBER: _ClassVar[int]
    SAMPLEABLE_FIELD_NUMBER: _ClassVar[int]
    AVAILABILITY_FIELD_NUMBER: _ClassVar[int]
    name: str
    max_sequence_length: int
    vocab_size: int
    architecture: str
    tokenizer_id: str
    max_lora_rank: int
    backend: str
    hidden_size: int
    revision: str
    family: str
    publisher: str
    renderer: str
    lora_targets: _containers.RepeatedScalarFieldContainer[str]
    modalities: _containers.RepeatedScalarFieldContainer[str]
    vision: VisionInfo
    tied_embeddings: bool
    language_model_prefix: str
    devices_per_replica: int
    parameter_count: int
    weight_dtype: str
    num_layers: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    lora_parameters_per_rank: int
    device_memory_bytes: int
    replica_bytes: int
    logits_chunk_elements: int
    full_finetune: bool
    trainable: bool
    sampleable: bool
    availability: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., max_sequence_length: _Optional[int] = ..., vocab_size: _Optional[int] = ..., architecture: _Optional[str] = ..., tokenizer_id: _Optional[str] = ..., max_lora_rank: _Optional[int] = ..., backend: _Optional[str] = ..., hidden_size: _Optional[int] = ..., revision: _Optional[str] = ..., family: _Optional[str] = ..., publisher: _Optional[str] = ..., renderer: _Optional[str] = ..., lora_targets: _Optional[_Iterable[str]] = ..., modalities: _Optional[_Iterable[str]] = ..., vision: _Optional[_Union[VisionInfo, _Mapping]] = ..., tied_embeddings: _Optional[bool] = ..., language_model_prefix: _Optional[str] = ..., devices_per_replica: _Optional[int] = ..., parameter_count: _Optional[int] = ..., weight_dtype: _Optional[str] = ..., num_layers: _Optional[int] = ..., intermediate_size: _Optional[int] = ..., num_attention_heads: _Optional[int] = ..., num_key_value_heads: _Optional[int] = ..., head_dim: _Optional[int] = ..., lora_parameters_per_rank: _Optional[int] = ..., device_memory_bytes: _Optional[int] = ..., replica_bytes: _Optional[int] = ..., logits_chunk_elements: _Optional[int] = ..., full_finetune: _Optional[bool] = ..., trainable: _Optional[bool] = ..., sampleable: _Optional[bool] = ..., availability: _Optional[_Iterable[str]] = ...) -> None: ...

class ClientInfo(_message.Message):
    __slots__ = ("name", "version", "runtime", "user_agent")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_FIELD_NUMBER: _ClassVar[int]
    USER_AGENT_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: str
    runtime: str
    user_agent: str
    def __init__(self, name: _Optional[str] = ..., version: _Optional[str] = ..., runtime: _Optional[str] = ..., user_agent: _Optional[str] = ...) -> None: ...
