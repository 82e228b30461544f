"""Direct preference optimisation (DPO) on (prompt, chosen, rejected) pairs.

Loss per pair: −log σ(β·[(lp_c − ref_c) − (lp_r − ref_r)]), where lp is the summed
log-probability of a completion under the policy and ref under the starting weights (computed
once, before the first step, with `forward`). The gradient goes to the server as a
`cross_entropy` step whose per-token weights are −∂loss/∂lp: +β·σ(−z) on the chosen tokens and
−β·σ(−z) on the rejected ones (what the SDK's forward_backward_custom does, without torch):
one `forward` then one `forward_backward` per step, at the same weights.

metrics.jsonl: dpo_loss, accuracy (share of pairs with chosen ranked above rejected), margin,
chosen_reward and rejected_reward (β·(lp − ref)); eval_* the same on the held-out pairs."""

from __future__ import annotations

import dataclasses
import math
import random

from loops_cookbook.config import field, resolve_data, BaseConfig
from loops_cookbook.data import load_jsonl, messages_error

DATA_FORMAT = """
JSONL, one pair per line: {"prompt": "..." | [messages], "chosen": "...", "rejected": "..."}.
A string prompt is one user message; chosen and rejected are assistant replies. train_data
and eval_data default to the bundled data/prefs_train.jsonl and data/prefs_eval.jsonl.
"""


@dataclasses.dataclass
class Config(BaseConfig):
    train_data: str | None = field(None, "training pairs (JSONL); default: bundled prefs_train.jsonl")
    eval_data: str | None = field(None, "held-out pairs (JSONL); default: bundled prefs_eval.jsonl")
    beta: float = field(0.1, "DPO temperature β")
    batch_size: int = field(8, "pairs per step")
    learning_rate: float = field(2e-3, "Adam learning rate (constant); ~1e-5 on a real model")
    steps: int = field(20, "optimizer steps")


def record_error(rec: object) -> str | None:
    if not isinstance(rec, dict):
        return "want an object"
    p = rec.get("prompt")
    if not (isinstance(p, str) or messages_error(p) is None):
        return "prompt must be a string or a list of messages"
    for k in ("chosen", "rejected"):
        if not isinstance(rec.get(k), str) or not rec[k]:
            return f"{k} must be a non-empty string"
    return None


def data_files(cfg: Config) -> dict:
    return {"train_data": (resolve_data(cfg.train_data, "prefs_train.jsonl"), record_error),
            "eval_data": (resolve_data(cfg.eval_data, "prefs_eval.jsonl"), record_error)}


def prompt_messages(rec: dict) -> list[dict]:
    p = rec["prompt"]
    return [{"role": "user", "content": p}] if isinstance(p, str) else list(p)


def pair_tokens(chat, rec: dict) -> list[tuple[list[int], list[float]]]:
    """(tokens, weights) of the chosen and the rejected conversation; weight 1 on the reply."""
    msgs = prompt_messages(rec)
    return [chat.conversation(msgs + [{"role": "assistant", "content": rec[k]}]) for k in ("chosen", "rejected")]


def token_lengths(cfg: Config, chat) -> list[int]:
    return [len(t) for path, check in data_files(cfg).values() for rec in load_jsonl(path, check)
            for t, _ in pair_tokens(chat, rec)]


def dpo_terms(lp: list[float], ref: list[float], beta: float) -> tuple[list[float], dict]:
    """Per-pair gradient scale β·σ(−z) and the batch metrics, for lp/ref laid out chosen, rejected, ..."""
    scales, loss, acc, cr, rr = [], 0.0, 0.0, 0.0, 0.0
    n = len(lp) // 2
    for i in range(n):
        c = beta * (lp[2 * i] - ref[2 * i])
        r = beta * (lp[2 * i + 1] - ref[2 * i + 1])
        z = c - r
        loss += math.log1p(math.exp(-z)) if z > -30 else -z
        acc += 1.0 if z > 0 else 0.0
        cr, rr = cr + c, rr + r
        scales.append(beta / (1.0 + math.exp(z)) if z > -30 else beta)
    return scales, {"dpo_loss": loss / n, "accuracy": acc / n, "margin": (cr - rr) / n,
                    "chosen_reward": cr / n, "rejected_reward": rr / n}


def estimate(cfg: Config, chat) -> dict:
    """The run's EstimateCost request: the model input length of every item main() passes to
    forward (the reference pass over all pairs, each step's batch, the eval pairs every 5
    steps and on the last) and forward_backward (each step's batch), in run order, as one
    step over that list."""
    files = data_files(cfg)

    def lengths(recs) -> list[int]:
        return [max(min(len(t), cfg.max_length) - 1, 0) for rec in recs for t, _ in pair_tokens(chat, rec)]

    train, evals = lengths(load_jsonl(*files["train_data"])), lengths(load_jsonl(*files["eval_data"]))
    items = train + evals
    rng = random.Random(cfg.seed)
    order: list[int] = []
    for step in range(1, cfg.steps + 1):
        if len(order) < cfg.batch_size:
            more = list(range(len(train) // 2))
            rng.shuffle(more)
            order += more
        batch = [train[2 * i + k] for i in order[:cfg.batch_size] for k in (0, 1)]
        del order[:cfg.batch_size]
        items += batch + batch  # forward for the policy's logprobs, then forward_backward
        if step == cfg.steps or step % 5 == 0:
            items += evals
    return {"base_model": cfg.model, "steps": 1, "batch_size": len(items), "example_tokens": items}


def main(cfg: Config) -> dict:
    from tinker import types

    from loops_cookbook.chat import ChatML
    from loops_cookbook.runtime import Run, sft_datum, weighted_logprob_sums

    files = data_files(cfg)
    train = load_jsonl(*files["train_data"])
    evals = load_jsonl(*files["eval_data"])
    run = Run("dpo", cfg)
    chat = ChatML(run.tokenizer)

    def to_data(recs):
        return [sft_datum(t, w, cfg.max_length) for rec in recs for t, w in pair_tokens(chat, rec)]

    train_data, eval_data = to_data(train), to_data(evals)

    def logprobs(data):
        return weighted_logprob_sums(data, run.training.forward(data, "cross_entropy").result().loss_fn_outputs)

    ref_train, ref_eval = logprobs(train_data), logprobs(eval_data)
    _, first_eval = dpo_terms(ref_eval, ref_eval, cfg.beta)
    rng = random.Random(cfg.seed)
    order: list[int] = []
    eval_m = first_eval
    for step in range(1, cfg.steps + 1):
        if len(order) < cfg.batch_size:
            more = list(range(len(train)))
            rng.shuffle(more)
            order += more
        idx = order[:cfg.batch_size]
        del order[:cfg.batch_size]
        batch = [train_data[2 * i + k] for i in idx for k in (0, 1)]
        ref = [ref_train[2 * i + k] for i in idx for k in (0, 1)]
        scales, m = dpo_terms(logprobs(batch), ref, cfg.beta)
        weighted = []
        for j, d in enumerate(batch):
            s = scales[j // 2] * (1.0 if j % 2 == 0 else -1.0)
            w = [x * s for x in d.loss_fn_inputs["weights"].tolist()]
            weighted.append(types.Datum(model_input=d.model_input,
                                        loss_fn_inputs={"target_tokens": d.loss_fn_inputs["target_tokens"], "weights": w}))
        run.training.forward_backward(weighted, "cross_entropy").result()
        run.optim_step()
        if step == cfg.steps or step % 5 == 0:
            _, eval_m = dpo_terms(logprobs(eval_data), ref_eval, cfg.beta)
            m.update({f"eval_{k}": v for k, v in eval_m.items()})
        run.log(step, **m)
        run.maybe_save(step)
    final = run.finish(cfg.steps)
    return {"run_id": run.run_id, "eval_start": first_eval, "eval_end": eval_m, "log_dir": str(run.log_dir), "final": final}
