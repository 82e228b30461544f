"""Sandboxed agent: multi-turn RL where the policy's commands run in a sandbox and the reward
comes from the task's final state.

Each episode gets a throwaway sandbox folder (loops_cookbook.sandbox: bubblewrap with no
network, a time and a memory limit per command; a weaker fallback without it, printed as
such), seeded with the task's files. Each turn the policy replies with one ```sh or
```python block; it runs in the folder and its exit code, stdout and stderr (cut to
`output_chars`) come back as the next user message. The episode ends when the policy replies
DONE or after `max_turns`; then the task's `check` (Python, run in the same folder and
sandbox) decides: reward 1 when it exits 0, plus `command_reward` if the policy ran at least
one command (a small format bonus), else 0. metrics.jsonl: reward, solved, commands,
commands_ok, turns.

On loops/tiny this runs end to end (every command block the model writes is executed);
solving tasks is an exercise for a real model on a GPU (cookbook/README.md)."""

from __future__ import annotations

import dataclasses
import re

from loops_cookbook.config import RLConfig, field, resolve_data
from loops_cookbook.data import load_jsonl
from loops_cookbook.env import Step

DATA_FORMAT = """
JSONL, one task per line: {"instruction": "...", "files": {"name": "content", ...} (optional),
"check": "Python code run in the task folder after the episode; exit status 0 = solved"}.
Default: the bundled data/agent_tasks.jsonl.
"""

USES_SANDBOX = True

SYSTEM_PROMPT = ("You work in a folder. Each reply: one ```sh or ```python code block to run, and you will see its "
                 "output. Reply DONE when the task is finished.")


@dataclasses.dataclass
class Config(RLConfig):
    data: str | None = field(None, "tasks (JSONL); default: bundled agent_tasks.jsonl")
    max_turns: int = field(4, "commands per episode at most")
    time_limit: float = field(5.0, "seconds per command (and for the check)")
    memory_mb: int = field(512, "address-space limit per command in MiB")
    output_chars: int = field(500, "characters of stdout/stderr shown to the policy")
    command_reward: float = field(0.1, "reward for running at least one command")
    max_tokens: int = field(96, "tokens sampled per turn")
    max_length: int = field(1024, "longest episode in tokens")
    group_size: int = field(4, "episodes per task")
    groups_per_batch: int = field(4, "tasks per step")
    steps: int = field(10, "RL steps")
    learning_rate: float = field(1e-3, "Adam learning rate; ~1e-5 on a real model")


def record_error(rec: object) -> str | None:
    if not isinstance(rec, dict) or not isinstance(rec.get("instruction"), str) or not isinstance(rec.get("check"), str):
        return 'want {"instruction": string, "check": string, "files": {name: content} (optional)}'
    files = rec.get("files", {})
    if not isinstance(files, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in files.items()):
        return "files must map names to string contents"
    try:
        compile(rec["check"], "check", "exec")
    except SyntaxError as e:
        return f"check is not valid Python: {e.msg}"
    return None


def data_files(cfg: Config) -> dict:
    return {"data": (resolve_data(cfg.data, "agent_tasks.jsonl"), record_error)}


def messages(rec: dict) -> list[dict]:
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": rec["instruction"]}]


def token_lengths(cfg: Config, chat) -> list[int]:
    return [len(chat.prompt(messages(r))) for r in load_jsonl(*data_files(cfg)["data"])]


_BLOCK = re.compile(r"```(sh|bash|python|py)\s*\n(.*?)(?:```|$)", re.S)


def parse_command(text: str) -> tuple[str, str] | None:
    """("sh" | "python", code) of the reply's first code block, or None."""
    m = _BLOCK.search(text)
    if not m:
        return None
    return ("python" if m.group(1) in ("python", "py") else "sh"), m.group(2)


class AgentEnv:
    """One task in its own sandbox folder; the folder goes when the episode ends."""

    def __init__(self, cfg: Config, chat, rec: dict) -> None:
        from loops_cookbook.sandbox import Sandbox

        self.cfg, self.chat, self.rec = cfg, chat, rec
        self.sb = Sandbox(time_limit=cfg.time_limit, memory_mb=cfg.memory_mb)
        self.turn = 0
        self.commands = 0
        self.commands_ok = 0

    def reset(self) -> list[int]:
        for name, content in self.rec.get("files", {}).items():
            self.sb.write(name, content)
        return self.chat.prompt(messages(self.rec))

    def step(self, action: list[int]) -> Step:
        self.turn += 1
        text = self.chat.response_text(action)
        cmd = parse_command(text)
        if cmd is not None:
            kind, code = cmd
            r = self.sb.run_python(code) if kind == "python" else self.sb.run_shell(code)
            self.commands += 1
            self.commands_ok += int(r.ok)
            if self.turn < self.cfg.max_turns and "DONE" not in text:
                n = self.cfg.output_chars
                obs = f"exit {'timeout' if r.timed_out else r.returncode}\nstdout:\n{r.stdout[:n]}\nstderr:\n{r.stderr[:n]}"
                return Step(done=False, metrics=self._metrics(0.0),
                            next_tokens=self.chat.continuation(action, [{"role": "user", "content": obs}]))
        return self.finish()

    def finish(self) -> Step:
        """Runs the task's check on the folder's final state."""
        solved = self.sb.run_python(self.rec["check"]).ok
        reward = (1.0 if solved else 0.0) + (self.cfg.command_reward if self.commands else 0.0)
        return Step(done=True, reward=reward, metrics=self._metrics(float(solved)))

    def _metrics(self, solved: float) -> dict:
        return {"solved": solved, "commands": float(self.commands), "commands_ok": float(self.commands_ok)}

    def close(self) -> None:
        self.sb.close()


def estimate(cfg: Config, chat, pilot: dict | None = None) -> dict:
    """The run's EstimateCost request, from a pilot (loops_cookbook.pilot): every step's
    prompts are the ones main() draws, through the tokenizer; what the policy writes
    (lengths, turns, the sandbox's outputs it reads back) and the share of groups trained
    are measured on the pilot's steps and the later steps extrapolated."""
    if pilot is None:
        return {"error": "sandboxed_agent's episodes depend on what the model writes: estimate it with a pilot (--pilot K runs its first K steps)"}
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

    tasks = load_jsonl(*data_files(cfg)["data"])
    with Sandbox() as sb:
        print(sb.warning or f"sandbox: {sb.mode} (no network, {cfg.time_limit:g}s, {cfg.memory_mb} MiB per command)",
              file=sys.stderr)
    run = Run("sandboxed_agent", cfg)
    chat = ChatML(run.tokenizer)

    def sample_task(rng):
        rec = rng.choice(tasks)
        return lambda: AgentEnv(cfg, chat, rec)

    rows = train_sync(run, cfg, sample_task, [chat.end], max_turns=cfg.max_turns)
    final = run.finish(cfg.steps)
    return {"run_id": run.run_id, "rewards": [r["reward"] for r in rows], "log_dir": str(run.log_dir), "final": final}
