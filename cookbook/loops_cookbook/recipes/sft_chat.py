"""Supervised fine-tuning on chat conversations (JSONL), with a held-out eval loss.

Each step trains on `batch_size` conversations (cross-entropy on the assistant turns only);
every `eval_every` steps, and at the start and end, the per-token NLL of the eval file is
measured with `forward` (no gradient). metrics.jsonl rows: train_loss (per assistant token),
and eval_loss on the steps that evaluate."""

from __future__ import annotations

import dataclasses

from loops_cookbook.config import BaseConfig, field, resolve_data
from loops_cookbook.data import load_jsonl, messages_error

DATA_FORMAT = """
JSONL, one conversation per line: {"messages": [{"role": "system"|"user"|"assistant", "content": "..."}, ...]}.
Loss is taken on assistant messages only. train_data and eval_data are separate files
(defaults: the bundled data/chat_train.jsonl and data/chat_eval.jsonl).
"""


@dataclasses.dataclass
class Config(BaseConfig):
    train_data: str | None = field(None, "training conversations (JSONL); default: bundled chat_train.jsonl")
    eval_data: str | None = field(None, "held-out conversations (JSONL); default: bundled chat_eval.jsonl")
    batch_size: int = field(8, "conversations per step")
    eval_every: int = field(5, "measure the eval loss every N steps (and at the first and last)")
    learning_rate: float = field(5e-3, "Adam learning rate (constant); 1e-4 is a usual start on a real model")


def record_error(rec: object) -> str | None:
    if not isinstance(rec, dict) or "messages" not in rec:
        return 'want an object with "messages"'
    why = messages_error(rec["messages"])
    if why:
        return why
    if not any(m["role"] == "assistant" for m in rec["messages"]):
        return "no assistant message to train on"
    return None


def data_files(cfg: Config) -> dict:
    """The data files `check` parses: role -> (path, validator)."""
    return {"train_data": (resolve_data(cfg.train_data, "chat_train.jsonl"), record_error),
            "eval_data": (resolve_data(cfg.eval_data, "chat_eval.jsonl"), record_error)}


def token_lengths(cfg: Config, chat) -> list[int]:
    """Token counts of every training and eval example (what `check` compares to the limit)."""
    return [len(chat.conversation(rec["messages"])[0])
            for path, check in data_files(cfg).values() for rec in load_jsonl(path, check)]


def estimate(cfg: Config, chat) -> dict:
    """The run's EstimateCost request: the model input length of every item main() passes to
    forward_backward (the batches in run order: supervised_loop's own schedule) and to
    forward (the eval file, at the start and on the steps that evaluate), as one step over
    that list."""
    from loops_cookbook.runtime import supervised_schedule

    files = data_files(cfg)

    def length(rec: dict) -> int:
        return max(min(len(chat.conversation(rec["messages"])[0]), cfg.max_length) - 1, 0)

    train = [length(r) for r in load_jsonl(*files["train_data"])]
    evals = [length(r) for r in load_jsonl(*files["eval_data"])]
    items: list[int] = list(evals)
    for _, batch, evaluates in supervised_schedule(cfg, len(train)):
        items += [train[i] for i in batch] + (evals if evaluates else [])
    return {"base_model": cfg.model, "steps": 1, "batch_size": len(items), "example_tokens": items}


def main(cfg: Config) -> dict:
    from loops_cookbook.chat import ChatML
    from loops_cookbook.runtime import Run, sft_datum, supervised_loop

    files = data_files(cfg)
    train = load_jsonl(*files["train_data"])
    evals = load_jsonl(*files["eval_data"])
    run = Run("sft_chat", cfg)
    chat = ChatML(run.tokenizer)

    def to_datum(rec: dict):
        return sft_datum(*chat.conversation(rec["messages"]), cfg.max_length)

    train_data = [to_datum(r) for r in train]
    eval_data = [to_datum(r) for r in evals]
    summary = supervised_loop(run, cfg, train_data, eval_data)
    return {**summary, "final": run.finish(cfg.steps)}
