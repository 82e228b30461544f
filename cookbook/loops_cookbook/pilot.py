"""A pilot for `loops cookbook check NAME --estimate --pilot K`: what an RL run's data cannot
say before it runs, measured on its first K steps, and the rest of the run extrapolated.

What is computed and what is measured:
- computed exactly, through the model's tokenizer: every step's prompts (the run's own task
  draws from its seed), so each step's prompt tokens and episode count; supervised phases
  (tool_calling's SFT) in full.
- measured on the pilot (the first K RL steps, run for real against the server and metered):
  per group of episodes, the prefill and cached prompt tokens its sample requests were
  metered (multi-turn episodes re-send the conversation each turn, tool outputs and
  observations included), the tokens sampled, and the training tokens (groups whose rewards
  are all equal are not trained on, so the share trained is measured too).

The pilot's K steps run again, the same, in the real run (the same seeds and draws), so
they count as measured. Each later step's group is extrapolated from the pilot's ratios:
prefill, cached and training tokens per prompt token of the group's episodes, sampled
tokens per episode. The band is two standard errors from the spread of those ratios over
the pilot's groups (the group-to-group spread of the later groups plus the uncertainty of
the pilot's mean), over its groups or over its steps, whichever is wider; it assumes the
later steps behave like the pilot's.

The share of groups trained is the exception (SHARE_RULE): groups whose rewards are all
equal are not trained on, and the share of groups with mixed rewards moves as the policy
learns (rl_async at CI settings trains 22% of its episodes at step 1 and all of them by
step 7 to 10, after a flat start), so no statistic of the first steps bounds it. Where the
recipe knows what a later group would train at most (`bound`: every episode trained,
every sample max_tokens long; single-turn recipes, whose datum is one per episode), the
band's high end for training is never below the pilot's measured steps plus that bound
for every later group, unless the share has settled: each of the pilot's last two steps
trained every one of its episodes, so the share cannot rise. A flat share below 100% is
not taken as settled (rl_async async trains 22%, 28%, 22% over its first three steps and
then climbs to 100%). Multi-turn recipes have no such bound from the data (tool outputs
and turns are the policy's), so their band stays the statistical one.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

# The EstimateCostRequest usage kinds of a group_usage's keys.
KINDS = {"trained": "USAGE_KIND_TRAINING_TOKENS", "prefill": "USAGE_KIND_SAMPLING_PREFILL_TOKENS",
         "sampled": "USAGE_KIND_SAMPLING_SAMPLE_TOKENS", "cached": "USAGE_KIND_SAMPLING_CACHED_PREFILL_TOKENS"}
# What each kind is extrapolated per: the group's prompt tokens (Σ over its episodes of the
# first prompt's length) or its episodes.
DRIVER = {"trained": "prompt", "prefill": "prompt", "cached": "prompt", "sampled": "episodes"}


# SHARE_RULE: how many of the pilot's last steps must have trained every episode for the
# share of groups trained to count as settled (module docstring).
SETTLED_STEPS = 2


def session_of(run: Any) -> str:
    """The server session of a runtime.Run (the Tinker SDK's session id): everything the run
    does is metered to it, and the OpenAI route meters to it a request that names it in its
    X-Loops-Session header."""
    holder = getattr(run.service, "holder", None)
    sid = holder.get_session_id() if holder is not None and hasattr(holder, "get_session_id") else None
    if not sid:
        raise ValueError("this tinker SDK does not tell its session id, so the pilot's cost cannot be told "
                         "apart from the workspace's other work: use tinker 0.38 or later")
    return str(sid)


def run(mod: Any, cfg: Any, k: int) -> dict:
    """Runs the recipe's main(cfg) until its K-th RL step has trained, then stops it (its
    session is ended) and returns {"steps": [[group_usage, ...] per step], "extra": ...,
    "sessions": [...], "runs": [...], "resume": log_dir}: `extra` is what the recipe's
    pilot_extra(cfg, run) measured after (tool_calling's evaluation), or None; `sessions`
    and `runs` are the server sessions and training runs the pilot used, everything it was
    metered (its cost: the usage rows of those sessions, and runs for the rows kept per
    run); the run's log folder holds a resumable checkpoint of the K-th step (`run NAME
    --resume log_dir` continues the run from it). The async loop's batches still in flight
    when the pilot stops finish before main() returns (its thread pools wait for them), so
    they are metered, to the pilot's session, by then."""
    from loops_cookbook import rl, runtime

    steps: list[list[dict]] = []
    sessions: dict[str, None] = {}
    runs: dict[str, None] = {}

    def note_open() -> None:
        for r in runtime._OPEN:
            sessions.setdefault(session_of(r))
            runs.setdefault(str(r.run_id))

    def observe(usage: list[dict]) -> None:
        note_open()
        steps.append(usage)

    rl.STEP_OBSERVERS.append(observe)
    rl.PAUSE_AFTER = k
    extra = None
    try:
        try:
            mod.main(cfg)
        except rl.Paused as p:
            paused = p
        else:
            raise ValueError(f"the run ended after {len(steps)} RL steps, before the pilot's {k}")
        note_open()
        if hasattr(mod, "pilot_extra") and runtime._OPEN:
            extra = mod.pilot_extra(cfg, runtime._OPEN[-1])
    finally:
        rl.PAUSE_AFTER = 0
        rl.STEP_OBSERVERS.remove(observe)
        runtime.close_open_runs("success", f"pilot of {k} steps for a cost estimate")
    return {"steps": steps, "extra": extra, "sessions": list(sessions), "runs": list(runs), "resume": paused.log_dir}


def _stats(ratios: Sequence[float]) -> tuple[float, float]:
    n = len(ratios)
    mean = sum(ratios) / n
    var = sum((r - mean) ** 2 for r in ratios) / (n - 1) if n > 1 else 0.0
    return mean, math.sqrt(var)


def _half_width(units: Sequence[dict], future: Sequence[dict], kind: str, driver: str) -> float:
    """Two standard errors of Σ over future units of kind, each at the ratio of kind to
    driver measured on units: for ratios r_f spread like the measured ones (sd) around a
    mean estimated from n units, Var(Σ r_f·d_f − r̂·Σ d_f) = sd²·Σ d_f² + sd²·(Σ d_f)²/n."""
    if len(units) < 2:
        return 0.0
    _, sd = _stats([u[kind] / u[driver] if u[driver] else 0.0 for u in units])
    ahead = sum(f[driver] for f in future)
    return 2 * sd * math.sqrt(sum(f[driver] ** 2 for f in future) + ahead ** 2 / len(units))


def _sum(groups: Sequence[dict]) -> dict:
    return {k: sum(g[k] for g in groups) for k in groups[0]} if groups else {}


def share_settled(pilot_steps: Sequence[Sequence[dict]]) -> bool:
    """Whether the pilot saw the share of episodes trained settle (SHARE_RULE): each of its
    last SETTLED_STEPS steps trained every episode (group_usage "datums" == "episodes")."""
    last = list(pilot_steps)[-SETTLED_STEPS:]
    return len(last) == SETTLED_STEPS and all(
        step and sum(g.get("datums", 0) for g in step) >= sum(g["episodes"] for g in step) for step in last)


def extrapolate(pilot_steps: Sequence[Sequence[dict]], later: Sequence[Sequence[dict]]) -> dict[str, list[int]]:
    """Tokens by kind of a run whose first steps were measured (pilot_steps: group_usage
    dicts) and whose later steps' groups are known by their drivers only (later: dicts with
    "prompt" and "episodes", and "bound" where the recipe knows the most training tokens
    the group can have): {kind: [amount, low, high]}. Measured steps count as they are;
    each later group at the pilot's ratio of kind to driver (the sum of the kind over the
    sum of the driver). The band is two standard errors, from the spread of the ratio over
    the pilot's groups, or over its steps when that is wider (a ratio that moves from step
    to step, as a policy learns, widens it; with one pilot step only the groups' spread is
    known). Training's high end is at least the measured steps plus every later group's
    bound while the share trained has not settled (SHARE_RULE, share_settled)."""
    groups = [g for step in pilot_steps for g in step]
    future = [g for step in later for g in step]
    steps = [_sum(step) for step in pilot_steps if step]
    future_steps = [_sum(step) for step in later if step]
    out: dict[str, list[int]] = {}
    for kind, driver in DRIVER.items():
        measured = sum(g[kind] for g in groups)
        base = sum(g[driver] for g in groups)
        point = measured + (measured / base if base else 0.0) * sum(g[driver] for g in future)
        half = max(_half_width(groups, future, kind, driver), _half_width(steps, future_steps, kind, driver))
        high = math.ceil(point + half)
        if kind == "trained" and future and all("bound" in f for f in future) and not share_settled(pilot_steps):
            high = max(high, measured + sum(f["bound"] for f in future))
        out[kind] = [round(point), max(measured, math.floor(point - half)), high]
    return out


def request(model: str, parts: Sequence[dict[str, list[int]]]) -> dict:
    """The EstimateCostRequest (JSON) of the sum of parts ({kind: [amount, low, high]})."""
    total: dict[str, list[int]] = {}
    for part in parts:
        for kind, (n, lo, hi) in part.items():
            t = total.setdefault(kind, [0, 0, 0])
            t[0], t[1], t[2] = t[0] + n, t[1] + lo, t[2] + hi
    usage = [{"kind": KINDS[k], "amount": n, "amount_low": lo, "amount_high": hi}
             for k, (n, lo, hi) in total.items() if hi > 0]
    return {"base_model": model, "usage": usage}


def exact(**amounts: int) -> dict[str, list[int]]:
    """A part computed exactly (its band is the amount itself)."""
    return {k: [n, n, n] for k, n in amounts.items()}


def rl_part(pilot: dict, cfg: Any, prompt_lengths: Sequence[Sequence[int]], single_turn: bool = False) -> dict[str, list[int]]:
    """The RL steps' part: the pilot's measured steps and the later steps extrapolated, from
    each step's groups' prompt lengths (prompt_lengths: per step, a list of them). A
    single-turn recipe (one sample request per group, one datum per trained episode) gives
    each later group its training bound, every episode trained at cfg.max_tokens sampled
    (prompt plus completion, as the server's no-pilot estimate counts a sample), which
    SHARE_RULE needs."""
    k = len(pilot["steps"])
    later = [[{"prompt": cfg.group_size * p, "episodes": cfg.group_size}
              | ({"bound": cfg.group_size * (p + cfg.max_tokens)} if single_turn else {}) for p in step]
             for step in prompt_lengths[k:]]
    return extrapolate(pilot["steps"], later)
