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
later steps behave like the pilot's, and a policy whose behaviour changes as it learns (the
share of groups trained rising with the reward, say) can end outside it.
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


def run(mod: Any, cfg: Any, k: int) -> dict:
    """Runs the recipe's main(cfg) until its K-th RL step has trained, then stops it (its
    session is ended) and returns {"steps": [[group_usage, ...] per step], "extra": ...,
    "resume": log_dir}: `extra` is what the recipe's pilot_extra(cfg, run) measured after
    (tool_calling's evaluation), or None; the run's log folder holds a resumable checkpoint
    of the K-th step (`run NAME --resume log_dir` continues the run from it)."""
    from loops_cookbook import rl, runtime

    steps: list[list[dict]] = []
    rl.STEP_OBSERVERS.append(steps.append)
    rl.PAUSE_AFTER = k
    extra = None
    try:
        try:
            mod.main(cfg)
        except rl.Paused as p:
            paused = p
        else:
            raise ValueError(f"the run ended after {len(steps)} RL steps, before the pilot's {k}")
        if hasattr(mod, "pilot_extra") and runtime._OPEN:
            extra = mod.pilot_extra(cfg, runtime._OPEN[-1])
    finally:
        rl.PAUSE_AFTER = 0
        rl.STEP_OBSERVERS.remove(steps.append)
        runtime.close_open_runs("success", f"pilot of {k} steps for a cost estimate")
    return {"steps": steps, "extra": extra, "resume": paused.log_dir}


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


def extrapolate(pilot_steps: Sequence[Sequence[dict]], later: Sequence[Sequence[dict]]) -> dict[str, list[int]]:
    """Tokens by kind of a run whose first steps were measured (pilot_steps: group_usage
    dicts) and whose later steps' groups are known by their drivers only (later: dicts with
    "prompt" and "episodes"): {kind: [amount, low, high]}. Measured steps count as they
    are; each later group at the pilot's ratio of kind to driver (the sum of the kind over
    the sum of the driver). The band is two standard errors, from the spread of the ratio
    over the pilot's groups, or over its steps when that is wider (a ratio that moves from
    step to step, as a policy learns, widens it; with one pilot step only the groups' spread
    is known)."""
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
        out[kind] = [round(point), max(measured, math.floor(point - half)), math.ceil(point + half)]
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


def rl_part(pilot: dict, cfg: Any, prompt_lengths: Sequence[Sequence[int]]) -> dict[str, list[int]]:
    """The RL steps' part: the pilot's measured steps and the later steps extrapolated, from
    each step's groups' prompt lengths (prompt_lengths: per step, a list of them)."""
    k = len(pilot["steps"])
    later = [[{"prompt": cfg.group_size * p, "episodes": cfg.group_size} for p in step] for step in prompt_lengths[k:]]
    return extrapolate(pilot["steps"], later)
