"""Runs tinker-cookbook 0.6.1's `recipes/rl_loop.py` (its `main`, unmodified) on loops/tiny,
offline. rl_loop has no `renderer_name` flag, downloads GSM8K and grades \\boxed{} answers,
none of which a 3.3M-parameter model offline can meet, so three lookups are replaced before
`main` runs, and nothing else:

- `model_info.get_recommended_renderer_name("loops/tiny")` -> `qwen3_instruct` (the cookbook's
  model table does not know loops/tiny; other names go to the table);
- `datasets.load_dataset("openai/gsm8k", "main")` -> 64 GSM8K-shaped arithmetic rows built here;
- `rl_loop.get_reward` -> 1.0 when the decoded response has an even number of characters, else
  0.0: a reward a random model earns about half the time, so groups have non-zero advantages
  and every step trains (with all advantages zero rl_loop skips the step).

The sampling, the datums (target tokens, logprobs, advantages, gspo's sequence_ratio_mask,
stable_reinforce's provenance), forward_backward, optim_step and checkpoints are rl_loop's own.
Usage: python rl_loop_offline.py key=value ... (rl_loop's chz flags).
"""

from __future__ import annotations

import chz
import datasets

from tinker_cookbook import model_info
from tinker_cookbook.recipes import rl_loop

_table = model_info.get_recommended_renderer_name


def _renderer(model_name: str) -> str:
    return "qwen3_instruct" if model_name == "loops/tiny" else _table(model_name)


def _gsm8k(*_args, **_kwargs) -> datasets.DatasetDict:
    rows = [{"question": f"What is {a} + {b}?", "answer": f"{a} + {b} = {a + b}\n#### {a + b}"}
            for a, b in ((i % 9 + 1, (i * 7) % 11 + 2) for i in range(64))]
    return datasets.DatasetDict({"train": datasets.Dataset.from_list(rows)})


def _reward(response: str, answer: str) -> float:
    return 1.0 if len(response) % 2 == 0 else 0.0


model_info.get_recommended_renderer_name = _renderer
datasets.load_dataset = _gsm8k
rl_loop.get_reward = _reward

if __name__ == "__main__":
    chz.nested_entrypoint(rl_loop.main)
