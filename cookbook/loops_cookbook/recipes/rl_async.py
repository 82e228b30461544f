"""RL on verifiable prompt/answer tasks, off-policy with bounded staleness.

A pipeline: the `groups_per_batch` groups of step t are sampled with the weights of step
max(0, t - 1 - `max_staleness`), while the trainer trains the steps before, so every batch is
exactly min(t - 1, `max_staleness`) steps old and a run repeats. `max_staleness=0` is the synchronous,
on-policy loop: sample with the newest weights, train, repeat. The loss is importance
sampling, which weights each token by exp(lp − q) and so accounts for the lag.

Reward per episode: 1 when the response (stripped) equals the record's answer, else
`format_reward` when it matches the record's `format` regex, else 0.

The bundled task (data/digits.jsonl, "digit copy") is one a 3M-parameter model can learn:
the prompt is `Copy: D` for a digit D and the answer is D, one token (max_tokens=1, chat=false).
A random policy scores ≈0.01; answering with any digit earns format_reward=0.2 and the right
one 1.0. Measured curves: cookbook/README.md."""

from __future__ import annotations

import dataclasses
import re

from loops_cookbook.config import field, resolve_data
from loops_cookbook.data import load_jsonl
from loops_cookbook.config import RLConfig
from loops_cookbook.env import Step

DATA_FORMAT = """
JSONL, one task per line: {"prompt": "...", "answer": "...", "format": "<optional regex>"}.
The reward is 1 for a response equal to answer (both stripped), format_reward for one that
matches format (re.fullmatch) but not the answer, else 0. With chat=true the prompt is sent
as a user message in the model's chat format; with chat=false it is sent as raw text.
Default: the bundled data/digits.jsonl.
"""


@dataclasses.dataclass
class Config(RLConfig):
    data: str | None = field(None, "tasks (JSONL); default: bundled digits.jsonl")
    max_staleness: int = field(2, "how many optimizer steps old a sample may be; 0 = synchronous on-policy")
    format_reward: float = field(0.2, "reward for a response in the right format but wrong")
    chat: bool = field(False, "send prompts in the chat format (true) or as raw text (false)")
    max_tokens: int = field(1, "tokens sampled per answer")
    group_size: int = field(8, "episodes per task")
    groups_per_batch: int = field(32, "tasks per training step")
    learning_rate: float = field(3e-3, "Adam learning rate (constant); ~1e-5..4e-5 on a real model")
    steps: int = field(30, "optimizer steps")


def record_error(rec: object) -> str | None:
    if not isinstance(rec, dict) or not isinstance(rec.get("prompt"), str) or not isinstance(rec.get("answer"), str):
        return 'want {"prompt": string, "answer": string}'
    fmt = rec.get("format")
    if fmt is not None:
        if not isinstance(fmt, str):
            return "format must be a string (a regex)"
        try:
            re.compile(fmt)
        except re.error as e:
            return f"format is not a valid regex: {e}"
    return None


def data_files(cfg: Config) -> dict:
    return {"data": (resolve_data(cfg.data, "digits.jsonl"), record_error)}


def prompt_tokens(cfg: Config, chat, rec: dict) -> list[int]:
    if cfg.chat:
        return chat.prompt([{"role": "user", "content": rec["prompt"]}])
    return chat.encode(rec["prompt"])


def token_lengths(cfg: Config, chat) -> list[int]:
    return [len(prompt_tokens(cfg, chat, r)) + cfg.max_tokens for r in load_jsonl(*data_files(cfg)["data"])]


def reward(rec: dict, response: str, format_reward: float) -> tuple[float, dict]:
    text = response.strip()
    if text == rec["answer"].strip():
        return 1.0, {"correct": 1.0, "formatted": 1.0}
    if rec.get("format") and re.fullmatch(rec["format"], text):
        return format_reward, {"correct": 0.0, "formatted": 1.0}
    return 0.0, {"correct": 0.0, "formatted": 0.0}


class AnswerEnv:
    """A one-turn episode: the prompt, one response, scored against the answer."""

    def __init__(self, cfg: Config, chat, rec: dict) -> None:
        self.cfg, self.chat, self.rec = cfg, chat, rec

    def reset(self) -> list[int]:
        return prompt_tokens(self.cfg, self.chat, self.rec)

    def step(self, action: list[int]) -> Step:
        r, m = reward(self.rec, self.chat.response_text(action), self.cfg.format_reward)
        return Step(done=True, reward=r, metrics=m)


def estimate(cfg: Config, chat, pilot: dict | None = None) -> dict:
    """The run's EstimateCost request. Every step's prompts are the ones main() draws (the
    same rng draws, in order), through the tokenizer; each group is one sample request of
    group_size samples. Without a pilot it is an upper bound: every sample max_tokens long
    and every group trained on (the run leaves out groups whose rewards are all equal). With
    a pilot (loops_cookbook.pilot), sampled lengths, the share trained and cache hits are
    measured on its steps and the later steps extrapolated."""
    from loops_cookbook.pilot import request, rl_part
    from loops_cookbook.rl import drawn_records

    steps = [[len(prompt_tokens(cfg, chat, r)) for r in step]
             for step in drawn_records(load_jsonl(*data_files(cfg)["data"]), cfg)]
    if pilot is not None:
        return request(cfg.model, [rl_part(pilot, cfg, steps, single_turn=True)])
    return {"base_model": cfg.model, "steps": cfg.steps, "batch_size": cfg.groups_per_batch,
            "prompt_tokens": [n for step in steps for n in step], "group_size": cfg.group_size,
            "completion_tokens": cfg.max_tokens}


def main(cfg: Config) -> dict:
    from loops_cookbook.chat import ChatML
    from loops_cookbook.rl import train_async
    from loops_cookbook.runtime import Run

    tasks = load_jsonl(*data_files(cfg)["data"])
    run = Run("rl_async", cfg)
    chat = ChatML(run.tokenizer)

    def sample_task(rng):
        rec = rng.choice(tasks)
        return lambda: AnswerEnv(cfg, chat, rec)

    rows = train_async(run, cfg, sample_task, [chat.end], cfg.max_staleness)
    final = run.finish(cfg.steps)
    rewards = [r["reward"] for r in rows]
    return {"run_id": run.run_id, "rewards": rewards, "log_dir": str(run.log_dir), "final": final}
