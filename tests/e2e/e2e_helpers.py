"""Shared helpers for the e2e suite (public tinker API only)."""

from __future__ import annotations

import math
import os
from typing import Any, Sequence

import numpy as np
import tinker
from tinker import types

BASE_MODEL = "loops/tiny"
RESULT_TIMEOUT = float(os.environ.get("LOOPS_E2E_TIMEOUT", "180"))

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Loops speaks the Tinker API so unmodified scripts train against it.",
    "A stitch in time saves nine.",
    "To be or not to be, that is the question.",
]


class ByteFallbackTokenizer:
    """Stand-in used only when get_tokenizer() fails: UTF-8 bytes as ids."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        del add_special_tokens
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        del skip_special_tokens
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")


def result(future: Any, timeout: float = RESULT_TIMEOUT) -> Any:
    """`.result()` with a bound, so a hung server fails the test instead of the run."""
    return future.result(timeout=timeout)


def encode(tokenizer: Any, text: str) -> list[int]:
    ids = tokenizer.encode(text, add_special_tokens=False)
    return [int(i) for i in ids]


def sft_datum(tokens: list[int], n_prompt: int = 0) -> types.Datum:
    """Next-token datum: input tokens[:-1], targets tokens[1:], weight 0 on the first
    `n_prompt` targets and 1 afterwards."""
    assert len(tokens) >= 2
    n = len(tokens) - 1
    weights = [0.0 if i < n_prompt else 1.0 for i in range(n)]
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": weights},
    )


def sft_batch(tokenizer: Any, sentences: Sequence[str] = SENTENCES) -> list[types.Datum]:
    return [sft_datum(encode(tokenizer, s), n_prompt=2) for s in sentences]


def logprobs_of(output: types.ForwardBackwardOutput) -> list[np.ndarray]:
    return [np.asarray(o["logprobs"].to_numpy(), dtype=np.float64) for o in output.loss_fn_outputs]


def weighted_nll(batch: Sequence[types.Datum], output: types.ForwardBackwardOutput) -> float:
    """-Σ w·logprob over the batch, computed client-side from the returned logprobs."""
    total = 0.0
    for datum, lp in zip(batch, logprobs_of(output), strict=True):
        w = np.asarray(datum.loss_fn_inputs["weights"].to_numpy(), dtype=np.float64)
        total += float(-(w * lp).sum())
    return total


def loss_sum(output: types.ForwardBackwardOutput) -> float:
    assert "loss:sum" in output.metrics, f"metrics lack loss:sum: {output.metrics}"
    return float(output.metrics["loss:sum"])


def train_step(
    tc: tinker.TrainingClient, batch: list[types.Datum], lr: float = 2e-3
) -> tuple[float, types.OptimStepResponse]:
    """forward_backward + optim_step submitted back to back (as the docs recommend);
    returns the loss of the forward pass and the optimizer response."""
    fb = tc.forward_backward(batch, "cross_entropy")
    opt = tc.optim_step(types.AdamParams(learning_rate=lr))
    out = result(fb)
    return loss_sum(out), result(opt)


def close(a: float, b: float, rel: float = 1e-4, abs_: float = 1e-5) -> bool:
    return math.isclose(a, b, rel_tol=rel, abs_tol=abs_)


def find_paged(list_page, key, want, limit: int = 100, max_pages: int = 50):
    """Walk a (limit, offset)-paged REST listing until an item with key(item)==want shows up."""
    offset = 0
    for _ in range(max_pages):
        page = result(list_page(limit=limit, offset=offset))
        items = page.training_runs if hasattr(page, "training_runs") else page.checkpoints
        for item in items:
            if key(item) == want:
                return item
        cursor = page.cursor
        if cursor is None or offset + len(items) >= cursor.total_count or not items:
            return None
        offset += len(items)
    return None
