"""Coding agent: the policy writes a Python function; the reward is the share of hidden unit
tests that pass when the code runs in the sandbox.

One turn per episode. The reply's code (the first ```python block, or the whole reply) is
written to solution.py in a throwaway sandbox folder; a harness runs every hidden test (an
`assert` statement the policy never sees) against it and reports how many passed. The
sandbox (loops_cookbook.sandbox) has no network and the recipe's time and memory limits; code
that loops forever or allocates too much scores 0. metrics.jsonl: reward (= pass share),
compiled (the code defined the entry point), sandbox_runs, timeouts.

The harness counts passes in the same process as the policy's code, so a policy could in
principle forge its report; run untrusted-at-scale training with one process per test.
On loops/tiny this runs end to end (every reply is executed; a random model passes nothing);
learning to code is an exercise for a real model on a GPU (cookbook/README.md)."""

from __future__ import annotations

import dataclasses
import json
import re

from loops_cookbook.config import field, resolve_data
from loops_cookbook.data import load_jsonl
from loops_cookbook.config import RLConfig
from loops_cookbook.env import Step

DATA_FORMAT = """
JSONL, one problem per line: {"prompt": "Write a function add(a, b) that ...", "entry_point":
"add", "tests": ["assert add(1, 2) == 3", ...]}. The tests are hidden from the policy.
Default: the bundled data/coding_tasks.jsonl.
"""

USES_SANDBOX = True

SYSTEM_PROMPT = "Write the requested Python function. Reply with the code only, in one ```python block."

HARNESS = r'''
import json, sys
tests = json.load(open("tests.json"))
entry = tests["entry_point"]
result = {"passed": 0, "total": len(tests["tests"]), "compiled": 0}
ns = {}
try:
    exec(compile(open("solution.py").read(), "solution.py", "exec"), ns)
    result["compiled"] = int(callable(ns.get(entry)))
except BaseException as e:
    result["error"] = type(e).__name__
if result["compiled"]:
    for t in tests["tests"]:
        try:
            exec(t, dict(ns))
            result["passed"] += 1
        except BaseException:
            pass
sys.stdout.write("\n" + json.dumps(result) + "\n")
'''


@dataclasses.dataclass
class Config(RLConfig):
    data: str | None = field(None, "problems (JSONL); default: bundled coding_tasks.jsonl")
    time_limit: float = field(5.0, "seconds the sandbox gives one solution's tests")
    memory_mb: int = field(512, "address-space limit of the sandbox in MiB")
    max_tokens: int = field(128, "tokens of code sampled")
    group_size: int = field(4, "samples per problem")
    groups_per_batch: int = field(4, "problems per step")
    steps: int = field(10, "RL steps")
    learning_rate: float = field(1e-3, "Adam learning rate; ~1e-5 on a real model")


def record_error(rec: object) -> str | None:
    if not isinstance(rec, dict) or not isinstance(rec.get("prompt"), str) or not isinstance(rec.get("entry_point"), str):
        return 'want {"prompt": string, "entry_point": string, "tests": [string, ...]}'
    tests = rec.get("tests")
    if not isinstance(tests, list) or not tests or not all(isinstance(t, str) for t in tests):
        return "tests must be a non-empty list of strings"
    return None


def data_files(cfg: Config) -> dict:
    return {"data": (resolve_data(cfg.data, "coding_tasks.jsonl"), record_error)}


def messages(rec: dict) -> list[dict]:
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": rec["prompt"]}]


def token_lengths(cfg: Config, chat) -> list[int]:
    return [len(chat.prompt(messages(r))) + cfg.max_tokens for r in load_jsonl(*data_files(cfg)["data"])]


_BLOCK = re.compile(r"```(?:python|py)?\s*\n(.*?)(?:```|$)", re.S)


def extract_code(text: str) -> str:
    m = _BLOCK.search(text)
    return m.group(1) if m else text


def score(code: str, rec: dict, time_limit: float, memory_mb: int) -> tuple[float, dict]:
    """Runs the hidden tests against code in a fresh sandbox: (pass share, metrics)."""
    from loops_cookbook.sandbox import Sandbox

    with Sandbox(time_limit=time_limit, memory_mb=memory_mb) as sb:
        sb.write("solution.py", code)
        sb.write("tests.json", json.dumps({"entry_point": rec["entry_point"], "tests": rec["tests"]}))
        r = sb.run_python(HARNESS)
    m = {"sandbox_runs": 1.0, "timeouts": float(r.timed_out), "compiled": 0.0}
    try:
        res = json.loads(r.stdout.strip().splitlines()[-1])
        m["compiled"] = float(res["compiled"])
        return res["passed"] / max(1, res["total"]), m
    except (ValueError, IndexError, KeyError, TypeError):
        return 0.0, m


class CodingEnv:
    def __init__(self, cfg: Config, chat, rec: dict) -> None:
        self.cfg, self.chat, self.rec = cfg, chat, rec

    def reset(self) -> list[int]:
        return self.chat.prompt(messages(self.rec))

    def step(self, action: list[int]) -> Step:
        code = extract_code(self.chat.response_text(action))
        r, m = score(code, self.rec, self.cfg.time_limit, self.cfg.memory_mb)
        return Step(done=True, reward=r, metrics=m)


def estimate(cfg: Config, chat, pilot: dict | None = None) -> dict:
    """The run's EstimateCost request, from a pilot (loops_cookbook.pilot): every step's
    prompts are the ones main() draws, through the tokenizer; what the policy writes
    (lengths, turns, the sandbox's outputs it reads back) and the share of groups trained
    are measured on the pilot's steps and the later steps extrapolated."""
    if pilot is None:
        return {"error": "coding_agent's episodes depend on what the model writes: estimate it with a pilot (--pilot K runs its first K steps)"}
    from loops_cookbook.pilot import request, rl_part
    from loops_cookbook.rl import drawn_records

    steps = [[len(chat.prompt(messages(r))) for r in step] for step in drawn_records(load_jsonl(*data_files(cfg)["data"]), cfg)]
    return request(cfg.model, [rl_part(pilot, cfg, steps)])


def main(cfg: Config) -> dict:
    import sys

    from loops_cookbook.chat import ChatML
    from loops_cookbook.rl import train_sync
    from loops_cookbook.runtime import Run
    from loops_cookbook.sandbox import Sandbox

    problems = load_jsonl(*data_files(cfg)["data"])
    with Sandbox() as sb:
        print(sb.warning or f"sandbox: {sb.mode} (no network, {cfg.time_limit:g}s, {cfg.memory_mb} MiB)", file=sys.stderr)
    run = Run("coding_agent", cfg)
    chat = ChatML(run.tokenizer)

    def sample_task(rng):
        rec = rng.choice(problems)
        return lambda: CodingEnv(cfg, chat, rec)

    rows = train_sync(run, cfg, sample_task, [chat.end])
    final = run.finish(cfg.steps)
    return {"run_id": run.run_id, "rewards": [r["reward"] for r in rows],
            "sandbox_runs": sum(r.get("sandbox_runs", 0.0) for r in rows) * cfg.group_size * cfg.groups_per_batch,
            "log_dir": str(run.log_dir), "final": final}
