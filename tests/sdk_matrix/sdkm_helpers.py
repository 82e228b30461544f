"""Helpers for the SDK matrix; only public tinker API that exists in every tested release."""

from __future__ import annotations

import math
import os
from typing import Any, Sequence

import numpy as np
import tinker
from tinker import types

BASE_MODEL = "loops/tiny"
RESULT_TIMEOUT = float(os.environ.get("LOOPS_E2E_TIMEOUT", "180"))
SDK_VERSION = tuple(int(x) for x in tinker.__version__.split(".")[:3])

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Loops speaks the Tinker API so unmodified scripts train against it.",
    "A stitch in time saves nine.",
    "To be or not to be, that is the question.",
]


def result(future: Any, timeout: float = RESULT_TIMEOUT) -> Any:
    """`.result()` with a bound. Releases before 0.3x return some clients directly
    (create_lora_training_client, create_training_client_from_state,
    save_weights_and_get_sampling_client); those pass through."""
    if not hasattr(future, "result"):
        return future
    return future.result(timeout=timeout)


def encode(tokenizer: Any, text: str) -> list[int]:
    return [int(i) for i in tokenizer.encode(text, add_special_tokens=False)]


def sft_datum(tokens: list[int], n_prompt: int = 0) -> types.Datum:
    n = len(tokens) - 1
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": tokens[1:],
            "weights": [0.0 if i < n_prompt else 1.0 for i in range(n)],
        },
    )


def sft_batch(tokenizer: Any, sentences: Sequence[str] = SENTENCES) -> list[types.Datum]:
    return [sft_datum(encode(tokenizer, s), n_prompt=2) for s in sentences]


def logprobs_of(output: Any) -> list[np.ndarray]:
    return [np.asarray(o["logprobs"].to_numpy(), dtype=np.float64) for o in output.loss_fn_outputs]


def loss_sum(output: Any) -> float:
    assert "loss:sum" in output.metrics, f"metrics lack loss:sum: {output.metrics}"
    return float(output.metrics["loss:sum"])


def train_step(tc: Any, batch: list[types.Datum], lr: float = 2e-3) -> float:
    fb = tc.forward_backward(batch, "cross_entropy")
    opt = tc.optim_step(types.AdamParams(learning_rate=lr))
    out = result(fb)
    result(opt)
    return loss_sum(out)


def close(a: float, b: float, rel: float = 1e-4, abs_: float = 1e-5) -> bool:
    return math.isclose(a, b, rel_tol=rel, abs_tol=abs_)


def new_client(service_client: Any, seed: int | None = None, rank: int = 8, **kw: Any) -> Any:
    return result(service_client.create_lora_training_client(
        base_model=BASE_MODEL, rank=rank, seed=seed, **kw))


def find_paged(list_page, key, want, limit: int = 100, max_pages: int = 50):
    offset = 0
    for _ in range(max_pages):
        page = result(list_page(limit=limit, offset=offset))
        items = page.training_runs if hasattr(page, "training_runs") else page.checkpoints
        for item in items:
            if key(item) == want:
                return item
        cursor = page.cursor
        if cursor is None or not items or offset + len(items) >= cursor.total_count:
            return None
        offset += len(items)
    return None
