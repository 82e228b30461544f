"""Tool calling: SFT on tool-call transcripts, then RL where the calls really run.

Phase 1 (`sft_steps`): cross-entropy on the assistant turns of the transcripts (a tool call,
then the answer). Phase 2 (`steps`): RL on questions. Each episode is multi-turn: the policy
may call a tool (`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`); the call is
executed against the local Python tools of loops_cookbook.tools (calculator, lookup, convert)
and the result comes back as a `tool` message; the episode ends at `Answer: ...` or after
`max_turns`. Reward: `valid_call_reward` once when the policy made a valid call that ran, plus
1 when the answer matches. metrics.jsonl: sft rows (train_loss) then RL rows (reward,
valid_call, tool_calls_executed, correct, ...).

Then (`eval_tasks` > 0) the final checkpoint is evaluated as an agent framework would call
it: through the server's OpenAI-compatible route (/oai/api/v1/chat/completions) with `tools`
(loops_cookbook.tools.OPENAI_TOOLS), the server parsing the model's calls into `tool_calls`,
which are executed locally and sent back as `tool` messages, up to `max_turns`; the summary's
`eval` gives the tasks, how many answers made tool calls the route parsed, the calls run, and
the correct answers.

On loops/tiny this runs end to end (calls parsed and executed whenever the model emits
one); learning to use tools is an exercise for a real model on a GPU (cookbook/README.md)."""

from __future__ import annotations

import dataclasses
import random

from loops_cookbook.config import field, resolve_data
from loops_cookbook.data import load_jsonl, messages_error
from loops_cookbook.config import RLConfig
from loops_cookbook.env import Step

DATA_FORMAT = """
Two JSONL files. transcripts: {"messages": [...]} in the sft_chat format, with role "tool"
messages holding tool results (default: bundled data/tool_transcripts.jsonl). tasks:
{"question": "...", "answer": "..."} (default: bundled data/tool_tasks.jsonl). The system
prompt (loops_cookbook.tools.SYSTEM_PROMPT) is added to every RL episode.
"""


@dataclasses.dataclass
class Config(RLConfig):
    transcripts: str | None = field(None, "SFT transcripts (JSONL); default: bundled tool_transcripts.jsonl")
    tasks: str | None = field(None, "RL questions (JSONL); default: bundled tool_tasks.jsonl")
    sft_steps: int = field(20, "SFT steps before RL")
    sft_batch_size: int = field(8, "transcripts per SFT step")
    sft_learning_rate: float = field(5e-3, "SFT learning rate; ~1e-4 on a real model")
    steps: int = field(10, "RL steps")
    learning_rate: float = field(1e-3, "RL learning rate; ~1e-5 on a real model")
    max_turns: int = field(3, "assistant turns per episode")
    max_tokens: int = field(64, "tokens sampled per turn")
    group_size: int = field(4, "episodes per question")
    groups_per_batch: int = field(4, "questions per RL step")
    valid_call_reward: float = field(0.2, "reward for making a valid tool call")
    eval_tasks: int = field(4, "tasks evaluated through the OpenAI-compatible route with tools after training (0: none)")


def transcript_error(rec: object) -> str | None:
    if not isinstance(rec, dict) or "messages" not in rec:
        return 'want an object with "messages"'
    return messages_error(rec["messages"])


def task_error(rec: object) -> str | None:
    if not isinstance(rec, dict) or not isinstance(rec.get("question"), str) or not isinstance(rec.get("answer"), str):
        return 'want {"question": string, "answer": string}'
    return None


def data_files(cfg: Config) -> dict:
    return {"transcripts": (resolve_data(cfg.transcripts, "tool_transcripts.jsonl"), transcript_error),
            "tasks": (resolve_data(cfg.tasks, "tool_tasks.jsonl"), task_error)}


def task_messages(rec: dict) -> list[dict]:
    from loops_cookbook.tools import SYSTEM_PROMPT

    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": rec["question"]}]


def token_lengths(cfg: Config, chat) -> list[int]:
    files = data_files(cfg)
    out = [len(chat.conversation(r["messages"])[0]) for r in load_jsonl(*files["transcripts"])]
    return out + [len(chat.prompt(task_messages(r))) + cfg.max_turns * cfg.max_tokens for r in load_jsonl(*files["tasks"])]


class ToolEnv:
    """One question; tool calls are executed in-process against loops_cookbook.tools."""

    def __init__(self, cfg: Config, chat, rec: dict) -> None:
        self.cfg, self.chat, self.rec = cfg, chat, rec
        self.turn = 0
        self.valid = 0.0
        self.executed = 0.0

    def reset(self) -> list[int]:
        return self.chat.prompt(task_messages(self.rec))

    def _reward(self, correct: bool) -> float:
        return (self.cfg.valid_call_reward if self.valid else 0.0) + (1.0 if correct else 0.0)

    def step(self, action: list[int]) -> Step:
        from loops_cookbook import tools

        self.turn += 1
        text = self.chat.response_text(action)
        answer = tools.parse_answer(text)
        call = tools.parse_call(text)
        if answer is not None and call is None:
            correct = tools.answers_match(answer, self.rec["answer"])
            return Step(done=True, reward=self._reward(correct), metrics=self._metrics(correct, answered=1.0))
        if isinstance(call, tuple) and self.turn < self.cfg.max_turns:
            ok, result = tools.execute(*call)
            self.executed += 1
            self.valid = self.valid or float(ok)
            return Step(done=False, reward=self._reward(False), metrics=self._metrics(False),
                        next_tokens=self.chat.continuation(action, [{"role": "tool", "content": result}]))
        if isinstance(call, str) and self.turn < self.cfg.max_turns:
            return Step(done=False, reward=self._reward(False), metrics=self._metrics(False),
                        next_tokens=self.chat.continuation(action, [{"role": "tool", "content": '{"error": "' + call.replace('"', "'") + '"}'}]))
        return Step(done=True, reward=self._reward(False), metrics=self._metrics(False))

    def _metrics(self, correct: bool, answered: float = 0.0) -> dict:
        return {"valid_call": self.valid, "tool_calls_executed": self.executed, "correct": float(correct),
                "answered": answered}


def openai_chat(cfg: Config, body: dict, session: str | None = None) -> dict:
    """POST /oai/api/v1/chat/completions on the recipe's server (with the SDK's API key), in
    the server session `session` when given (X-Loops-Session: its usage is metered there)."""
    import json
    import os
    import urllib.request

    from loops_cookbook.config import base_url

    url = (base_url(cfg) or "http://127.0.0.1:8000").rstrip("/") + "/oai/api/v1/chat/completions"
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST", headers={
        "Content-Type": "application/json", "X-API-Key": os.environ.get("TINKER_API_KEY", "tml-cookbook"),
        **({"X-Loops-Session": session} if session else {})})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read())


def evaluate(cfg: Config, model: str, tasks: list[dict], session: str | None = None) -> dict:
    """The agent loop over the OpenAI route with tools on the first eval_tasks tasks: the
    route's tool_calls are executed locally and answered with tool messages (its requests
    metered to the server session `session` when given)."""
    import json

    from loops_cookbook import tools

    out = {"tasks": 0, "answers_with_tool_calls": 0, "calls_run": 0, "correct": 0, "usage": []}
    for rec in tasks[:cfg.eval_tasks]:
        out["tasks"] += 1
        messages = task_messages(rec)
        used = {"prefill": 0, "cached": 0, "sampled": 0}  # what the task's requests were metered
        out["usage"].append(used)
        for _ in range(cfg.max_turns):
            res = openai_chat(cfg, {"model": model, "messages": messages, "tools": tools.OPENAI_TOOLS,
                                    "temperature": 0, "max_tokens": cfg.max_tokens}, session)
            u = res.get("usage") or {}
            cached = int((u.get("prompt_tokens_details") or {}).get("cached_tokens", 0))
            used["prefill"] += int(u.get("prompt_tokens", 0)) - cached
            used["cached"] += cached
            used["sampled"] += int(u.get("completion_tokens", 0))
            msg = res["choices"][0]["message"]
            calls = msg.get("tool_calls") or []
            if not calls:
                answer = tools.parse_answer(msg.get("content") or "")
                out["correct"] += int(answer is not None and tools.answers_match(answer, rec["answer"]))
                break
            out["answers_with_tool_calls"] += 1
            messages.append({"role": "assistant", "content": msg.get("content"), "tool_calls": calls})
            for c in calls:
                name, args = c["function"]["name"], json.loads(c["function"]["arguments"])
                ok, result = tools.execute(name, args) if name in tools.TOOLS else (False, '{"error": "unknown tool"}')
                out["calls_run"] += int(ok)
                messages.append({"role": "tool", "tool_call_id": c["id"], "content": result})
    return out


def estimate(cfg: Config, chat, pilot: dict | None = None) -> dict:
    """The run's EstimateCost request, from a pilot (loops_cookbook.pilot). The SFT phase is
    computed exactly (the same batch draws, each transcript's model input length); the RL
    steps' prompts are the ones main() draws, and what the policy does (turns, tool calls and
    their results, lengths, the share of groups trained) is measured on the pilot's steps,
    the later steps extrapolated. The evaluation through the OpenAI route is measured once
    on the pilot's weights (its band: the tasks' least and most)."""
    if pilot is None:
        return {"error": "tool_calling's episodes depend on what the model writes: estimate it with a pilot (--pilot K runs its SFT steps and its first K RL steps)"}
    from loops_cookbook.pilot import exact, request, rl_part
    from loops_cookbook.rl import drawn_records

    files = data_files(cfg)
    sft = [max(min(len(chat.conversation(r["messages"])[0]), cfg.max_length) - 1, 0) for r in load_jsonl(*files["transcripts"])]
    rng = random.Random(cfg.seed)
    trained = sum(sum(rng.sample(sft, min(cfg.sft_batch_size, len(sft)))) for _ in range(cfg.sft_steps))
    steps = [[len(chat.prompt(task_messages(r))) for r in step] for step in drawn_records(load_jsonl(*files["tasks"]), cfg)]
    parts = [exact(trained=trained), rl_part(pilot, cfg, steps)]
    if ev := pilot.get("extra"):
        n = len(ev)
        parts.append({k: [sum(t[k] for t in ev), n * min(t[k] for t in ev), n * max(t[k] for t in ev)]
                      for k in ("prefill", "cached", "sampled")})
    return request(cfg.model, parts)


def pilot_extra(cfg: Config, run) -> list[dict] | None:
    """The pilot's measure of the evaluation: its tasks through the OpenAI route on the
    pilot's weights, what each task's requests were metered (in the pilot's session, so
    that the pilot's cost counts them)."""
    from loops_cookbook.pilot import session_of

    if cfg.eval_tasks <= 0:
        return None
    path = run.training.save_weights_for_sampler("pilot").result().path
    return evaluate(cfg, path, load_jsonl(*data_files(cfg)["tasks"]), session_of(run))["usage"]


def main(cfg: Config) -> dict:
    from loops_cookbook.chat import ChatML
    from loops_cookbook.rl import train_sync
    from loops_cookbook.runtime import Run, sft_datum

    files = data_files(cfg)
    transcripts = load_jsonl(*files["transcripts"])
    tasks = load_jsonl(*files["tasks"])
    run = Run("tool_calling", cfg, total=cfg.sft_steps + cfg.steps)
    chat = ChatML(run.tokenizer)
    sft = [sft_datum(*chat.conversation(r["messages"]), cfg.max_length) for r in transcripts]
    rng = random.Random(cfg.seed)
    from tinker import types

    from loops_cookbook.runtime import rng_state

    start = 0
    if (state := run.resumed) is not None:  # SFT steps done (all of them when it resumes in RL)
        start = state["step"] if state["phase"] == "sft" else cfg.sft_steps
        if state["phase"] == "sft":
            rng.setstate(rng_state(state["rng"]))
    for step in range(start + 1, cfg.sft_steps + 1):
        batch = rng.sample(sft, min(cfg.sft_batch_size, len(sft)))
        out = run.training.forward_backward(batch, "cross_entropy").result()
        tokens = sum(sum(d.loss_fn_inputs["weights"].tolist()) for d in batch)
        run.training.optim_step(types.AdamParams(learning_rate=cfg.sft_learning_rate)).result()
        run.log(step, phase="sft", train_loss=float(out.metrics["loss:sum"]) / max(1.0, tokens))
        run.maybe_save(step, lambda: {"phase": "sft", "step": step, "rng": rng.getstate()})

    def sample_task(r):
        rec = r.choice(tasks)
        return lambda: ToolEnv(cfg, chat, rec)

    rows = train_sync(run, cfg, sample_task, [chat.end], max_turns=cfg.max_turns, step_offset=cfg.sft_steps)
    final = run.finish(cfg.sft_steps + cfg.steps)
    out = {"run_id": run.run_id, "rewards": [r["reward"] for r in rows], "log_dir": str(run.log_dir), "final": final}
    if cfg.eval_tasks > 0:
        out["eval"] = evaluate(cfg, final["sampler_path"], tasks)
    return out
