"""The RL machinery the RL recipes share: rollouts of (multi-turn) environments with a sampler,
group-relative advantages, importance-sampling updates, and a synchronous or an asynchronous
(bounded-staleness) training loop.

An environment plays one episode: `reset()` returns the prompt tokens; `step(action_tokens)`
returns a Step: done, reward (on the last step), the tokens that continue the conversation
(when not done), and metrics. A multi-turn episode is one sequence: each observation extends
the previous prompt and action, so one datum carries every turn (action tokens are trained,
observation tokens are not).

Advantages are reward minus the group mean (the G episodes of one task); groups whose
rewards are all equal teach nothing and are left out. The loss is `importance_sampling`
(−Σ exp(lp − q)·A over action tokens), which also corrects for the lag of off-policy samples.
"""

from __future__ import annotations

import dataclasses
import random
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Sequence

import tinker
from tinker import types

from loops_cookbook.config import RLConfig
from loops_cookbook.env import Env, Episode
from loops_cookbook.runtime import resolved, rng_state


def rollout(sampler: tinker.SamplingClient, env: Env, params: types.SamplingParams, max_length: int,
            max_turns: int = 1, seed: int = 0) -> Episode:
    """Plays one episode to its end (or to max_turns / max_length, scored by the env's last step).
    Turn t samples with seed+t, so a run's samples follow from its seed."""
    prompt = env.reset()
    ep = Episode(list(prompt), [0.0] * len(prompt), [0.0] * len(prompt), prompt=len(prompt))
    while True:
        turn_params = params.model_copy(update={"seed": seed + ep.turns})
        res = sampler.sample(types.ModelInput.from_ints(ep.tokens), 1, turn_params).result()
        ep.prefill += len(ep.tokens)
        ep.cached += int(getattr(res, "prompt_cache_hit_tokens", 0) or 0)
        seq = res.sequences[0]
        ep.tokens += seq.tokens
        ep.logprobs += [float(x) for x in (seq.logprobs or [0.0] * len(seq.tokens))]
        ep.mask += [1.0] * len(seq.tokens)
        ep.turns += 1
        st = env.step(list(seq.tokens))
        ep.metrics.update(st.metrics)
        if st.done or ep.turns >= max_turns or len(ep.tokens) + len(st.next_tokens) >= max_length:
            ep.reward = st.reward
            if close := getattr(env, "close", None):
                close()
            return ep
        ep.tokens += st.next_tokens
        ep.logprobs += [0.0] * len(st.next_tokens)
        ep.mask += [0.0] * len(st.next_tokens)


def datums(group: Sequence[Episode]) -> list[types.Datum]:
    """Importance-sampling data of one group: advantage = reward − group mean on action tokens."""
    mean = sum(e.reward for e in group) / len(group)
    out = []
    for e in group:
        adv = e.reward - mean
        if adv == 0:
            continue
        out.append(types.Datum(
            model_input=types.ModelInput.from_ints(e.tokens[:-1]),
            loss_fn_inputs={"target_tokens": e.tokens[1:], "logprobs": e.logprobs[1:],
                            "advantages": [adv * m for m in e.mask[1:]]}))
    return out


# Called with each step's group_usage once the step has trained (the pilot of `loops
# cookbook check --estimate --pilot K` listens here; it may raise to stop the run).
STEP_OBSERVERS: list[Callable[[list[dict[str, int]]], None]] = []


def group_usage(group: Sequence[Episode], data: Sequence[types.Datum]) -> dict[str, int]:
    """What one group was metered, by the server's rules: prefill and cached prompt tokens
    of its sample requests, sampled tokens, and training tokens (the model input lengths of
    its datums); with `prompt` (Σ of its episodes' first prompt lengths) and `episodes`,
    which a run's data decides before it starts, and `datums` (how many it trained: the
    pilot's SHARE_RULE)."""
    return {"prompt": sum(e.prompt for e in group), "episodes": len(group),
            "prefill": sum(e.prefill - e.cached for e in group), "cached": sum(e.cached for e in group),
            "sampled": int(sum(sum(e.mask) for e in group)), "trained": sum(d.model_input.length for d in data),
            "datums": len(data)}


def train_on(tc: tinker.TrainingClient, groups: Sequence[Sequence[Episode]], learning_rate: float) -> dict[str, float]:
    """One importance-sampling step on the groups; returns reward and KL metrics."""
    episodes = [e for g in groups for e in g]
    per_group = [datums(g) for g in groups]
    data = [d for ds in per_group for d in ds]
    m: dict[str, float] = {
        "reward": sum(e.reward for e in episodes) / len(episodes),
        "frac_mixed": sum(len({e.reward for e in g}) > 1 for g in groups) / len(groups),
        "turns": sum(e.turns for e in episodes) / len(episodes),
        "action_tokens": float(sum(sum(e.mask) for e in episodes)) / len(episodes),
        "datums": float(len(data)),
    }
    keys = {k for e in episodes for k in e.metrics}
    for k in sorted(keys):
        m[k] = sum(e.metrics.get(k, 0.0) for e in episodes) / len(episodes)
    if data:
        out = tc.forward_backward(data, "importance_sampling").result()
        diff = n = 0.0
        for d, o in zip(data, out.loss_fn_outputs):
            lp = o["logprobs"].tolist()
            q = d.loss_fn_inputs["logprobs"].tolist()
            a = d.loss_fn_inputs["advantages"].tolist()
            for x, y, adv in zip(lp, q, a):
                if adv != 0:
                    diff += y - x
                    n += 1
        m["kl_sample_train"] = diff / max(1.0, n)
        tc.optim_step(types.AdamParams(learning_rate=learning_rate)).result()
    usage = [group_usage(g, ds) for g, ds in zip(groups, per_group)]
    for observe in list(STEP_OBSERVERS):
        observe(usage)
    return m


def sampling_params(cfg: RLConfig, stop: list[int]) -> types.SamplingParams:
    return types.SamplingParams(max_tokens=cfg.max_tokens, temperature=cfg.temperature, stop=stop)


# A task source: given a random generator, returns a function that builds a fresh env for one
# episode of the next task (all G episodes of a group share the task).
TaskSampler = Callable[[random.Random], Callable[[], Env]]


def draw_groups(rng: random.Random, tasks: TaskSampler, n: int) -> list[tuple[Callable[[], Env], int]]:
    """The next n groups of a step: each one's task and sampling seed, drawn in order."""
    return [(tasks(rng), rng.randrange(1 << 30)) for _ in range(n)]


def drawn_records(records: Sequence[Any], cfg: RLConfig) -> list[list[Any]]:
    """The task records every step of a run draws, per step, for a recipe whose task
    sampler is `rng.choice(records)`: the same draws train_sync and train_async make."""
    rng = random.Random(cfg.seed)
    return [[rec for rec, _ in draw_groups(rng, lambda r: r.choice(records), cfg.groups_per_batch)]
            for _ in range(cfg.steps)]


def play_group(sampler: tinker.SamplingClient, make_env: Callable[[], Env], cfg: RLConfig,
               params: types.SamplingParams, pool: ThreadPoolExecutor, max_turns: int, seed: int) -> list[Episode]:
    if max_turns == 1:
        # One-turn episodes of one task share the prompt: one request samples the whole group.
        envs = [make_env() for _ in range(cfg.group_size)]
        prompts = [e.reset() for e in envs]
        if all(p == prompts[0] for p in prompts):
            group_params = params.model_copy(update={"seed": seed})
            res = sampler.sample(types.ModelInput.from_ints(prompts[0]), cfg.group_size, group_params).result()
            futs = [pool.submit(_finish_one_turn, env, prompts[0], seq) for env, seq in zip(envs, res.sequences)]
            group = [f.result() for f in futs]
            # one request for the group: its prompt is metered once
            group[0].prefill = len(prompts[0])
            group[0].cached = int(getattr(res, "prompt_cache_hit_tokens", 0) or 0)
            return group
    futs = [pool.submit(rollout, sampler, make_env(), params, cfg.max_length, max_turns, seed + 1000 * i)
            for i in range(cfg.group_size)]
    return [f.result() for f in futs]


def _finish_one_turn(env: Env, prompt: list[int], seq: Any) -> Episode:
    """Scores one sampled sequence of a one-turn episode (the env's step may run code)."""
    st = env.step(list(seq.tokens))
    return Episode(tokens=list(prompt) + list(seq.tokens),
                   logprobs=[0.0] * len(prompt) + [float(x) for x in (seq.logprobs or [0.0] * len(seq.tokens))],
                   mask=[0.0] * len(prompt) + [1.0] * len(seq.tokens), reward=st.reward, metrics=dict(st.metrics), turns=1,
                   prompt=len(prompt))


# Set by a pilot (loops_cookbook.pilot): after this many RL steps a loop saves a resumable
# checkpoint (training state with the optimizer, and its loop state) and raises Paused.
PAUSE_AFTER = 0


class Paused(Exception):
    """A loop stopped after PAUSE_AFTER RL steps; `run --resume` continues it from its log_dir."""

    def __init__(self, log_dir: str, step: int) -> None:
        super().__init__(f"paused after step {step}; continue with --resume {log_dir}")
        self.log_dir, self.step = log_dir, step


def _end_step(run: Any, step: int, rl_step: int, loop_state: Callable[[], dict]) -> None:
    """After a logged step: the pilot's pause (a resumable checkpoint, then Paused), else a
    periodic checkpoint with the loop state."""
    if PAUSE_AFTER and rl_step >= PAUSE_AFTER:
        run.save(f"pilot-{step:06d}", step, loop_state())
        raise Paused(str(run.log_dir.resolve()), step)
    run.maybe_save(step, loop_state)


def _resumed_rl(run: Any, rng: random.Random) -> int:
    """The RL steps done before a resumed run's checkpoint (0 when it starts fresh or resumes
    in an earlier phase), with rng set to where that run's draws stood. The loops return
    the earlier steps' rows (from metrics.jsonl) with theirs."""
    state = getattr(run, "resumed", None)
    if state is None or state.get("phase") != "rl":
        return 0
    rng.setstate(rng_state(state["rng"]))
    return int(state["rl_step"])


def episode_json(e: Episode) -> dict:
    return dataclasses.asdict(e)


def _done(value: Any) -> Future:
    f: Future = Future()
    f.set_result(value)
    return f


def train_sync(run: Any, cfg: RLConfig, tasks: TaskSampler, stop: list[int], max_turns: int = 1,
               step_offset: int = 0) -> list[dict]:
    """On-policy RL: each step samples with the newest weights, then trains on those samples.
    A checkpoint's loop state is the step and the task draws' rng position; a resumed run
    (run.resumed) continues from it and returns the rows of the steps it ran."""
    rng = random.Random(cfg.seed)
    start = _resumed_rl(run, rng)
    params = sampling_params(cfg, stop)
    rows = [r for r in run.earlier if "reward" in r] if start else []
    with ThreadPoolExecutor(cfg.concurrency) as pool, ThreadPoolExecutor(cfg.groups_per_batch) as groups_pool:
        for step in range(start + 1, cfg.steps + 1):
            sampler = resolved(run.training.save_weights_and_get_sampling_client())
            makers = draw_groups(rng, tasks, cfg.groups_per_batch)
            groups = list(groups_pool.map(lambda m: play_group(sampler, m[0], cfg, params, pool, max_turns, m[1]), makers))
            m = train_on(run.training, groups, cfg.learning_rate)
            rows.append(m)
            run.log(step_offset + step, **m)
            _end_step(run, step_offset + step, step, lambda: {"phase": "rl", "rl_step": step, "rng": rng.getstate()})
    return rows


def train_async(run: Any, cfg: RLConfig, tasks: TaskSampler, stop: list[int], max_staleness: int,
                max_turns: int = 1) -> list[dict]:
    """Off-policy RL with bounded staleness, as a pipeline: the groups of step t are sampled
    with the weights of step max(0, t - 1 - max_staleness), so they are sampled while the
    trainer is still on the steps before (up to max_staleness + 1 batches in flight) and are
    exactly min(t - 1, max_staleness) steps old when trained on. The schedule does not depend
    on thread timing, so a run repeats exactly like the synchronous loop.

    A checkpoint waits for the batches in flight and saves their episodes with the step and
    the draws' rng position: a resumed run trains on those same episodes (sampled, and
    billed, once) and launches the later batches as the uninterrupted run would."""
    if max_staleness <= 0:
        return train_sync(run, cfg, tasks, stop, max_turns)
    rng = random.Random(cfg.seed)
    start = _resumed_rl(run, rng)
    params = sampling_params(cfg, stop)
    rows = [r for r in run.earlier if "reward" in r] if start else []
    with ThreadPoolExecutor(cfg.concurrency) as pool, \
            ThreadPoolExecutor(cfg.groups_per_batch * (max_staleness + 1)) as groups_pool:
        def launch(sampler: tinker.SamplingClient) -> list[Any]:
            # tasks and seeds are drawn here, in step order, so they do not depend on timing
            makers = draw_groups(rng, tasks, cfg.groups_per_batch)
            return [groups_pool.submit(play_group, sampler, m, cfg, params, pool, max_turns, seed)
                    for m, seed in makers]

        def loop_state() -> dict:
            flight = {str(t): [[episode_json(e) for e in f.result()] for f in fs] for t, fs in in_flight.items()}
            return {"phase": "rl", "rl_step": step, "rng": rng.getstate(), "in_flight": flight}

        if start:
            saved = run.resumed["in_flight"]
            in_flight = {int(t): [_done([Episode(**e) for e in g]) for g in groups] for t, groups in saved.items()}
        else:
            first = resolved(run.training.save_weights_and_get_sampling_client())
            # steps 1 .. max_staleness + 1 sample with the initial weights
            in_flight = {t: launch(first) for t in range(1, min(cfg.steps, max_staleness + 1) + 1)}
        for step in range(start + 1, cfg.steps + 1):
            groups = [f.result() for f in in_flight.pop(step)]
            m = train_on(run.training, groups, cfg.learning_rate)
            lag = float(min(step - 1, max_staleness))  # every group of the step is this old
            m.update({"staleness_mean": lag, "staleness_max": lag})
            sampler = resolved(run.training.save_weights_and_get_sampling_client())
            nxt = step + max_staleness + 1
            if nxt <= cfg.steps:
                in_flight[nxt] = launch(sampler)
            rows.append(m)
            run.log(step, **m)
            _end_step(run, step, step, loop_state)
    return rows
