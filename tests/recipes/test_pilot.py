"""The pilot's extrapolation and its band (cookbook/loops_cookbook/pilot.py), in pure Python:
no server. SHARE_RULE: while the pilot has not seen the share of episodes trained settle,
training's high end is at least what the data allows (every later episode trained at its
longest), so a run whose share climbs as it learns stays inside the band."""

from __future__ import annotations

from loops_cookbook import pilot

GROUP = 8  # episodes per group
PROMPT = 6  # prompt tokens per episode
MAX_TOKENS = 1


def group(trained_episodes: int) -> dict:
    """One single-turn group as rl.group_usage reports it: trained_episodes of GROUP
    trained, each datum PROMPT + MAX_TOKENS - 1 tokens long."""
    return {"prompt": GROUP * PROMPT, "episodes": GROUP, "prefill": GROUP * PROMPT, "cached": 0,
            "sampled": GROUP * MAX_TOKENS, "trained": trained_episodes * (PROMPT + MAX_TOKENS - 1),
            "datums": trained_episodes}


def step(trained: list[int]) -> list[dict]:
    return [group(t) for t in trained]


def later(steps: int, groups: int, bound: bool = True) -> list[list[dict]]:
    g = {"prompt": GROUP * PROMPT, "episodes": GROUP}
    if bound:
        g["bound"] = GROUP * (PROMPT + MAX_TOKENS)
    return [[dict(g) for _ in range(groups)] for _ in range(steps)]


def truth(pilot_steps: list[list[dict]], rest: list[list[dict]]) -> int:
    return sum(g["trained"] for s in pilot_steps + rest for g in s)


def test_a_rising_share_stays_inside_the_band():
    # The share climbs as the policy learns (as rl_async's does: 22% of the episodes at
    # step 1, all of them by step 7): 3 pilot steps, then 12 steps that train far more.
    shares = [[2, 2, 0, 4], [2, 4, 2, 4], [4, 4, 2, 6]] + [[8, 8, 6, 8]] * 12
    measured, rest = [step(s) for s in shares[:3]], [step(s) for s in shares[3:]]
    want = truth(measured, rest)
    got = pilot.extrapolate(measured, later(12, 4))["trained"]
    statistical = pilot.extrapolate(measured, later(12, 4, bound=False))["trained"]
    assert statistical[2] < want, "the statistical band alone excludes the truth: the rule is needed"
    assert got[0] == statistical[0], "the point estimate is unchanged"
    assert got[1] <= want <= got[2]
    # the high end is exactly the measured steps plus every later group's bound
    assert got[2] == sum(g["trained"] for s in measured for g in s) + 12 * 4 * GROUP * (PROMPT + MAX_TOKENS)


def test_a_flat_share_below_all_is_not_settled():
    # 25% of the episodes on each of 5 pilot steps, then every episode: flat is no evidence.
    measured = [step([2, 2, 2, 2]) for _ in range(5)]
    assert not pilot.share_settled(measured)
    rest = [step([8, 8, 8, 8]) for _ in range(10)]
    lo, hi = pilot.extrapolate(measured, later(10, 4))["trained"][1:]
    assert lo <= truth(measured, rest) <= hi


def test_a_settled_share_keeps_the_statistical_band():
    # every episode trained on each of the last two pilot steps: the share cannot rise
    measured = [step([4, 6, 6, 8]), step([8, 8, 8, 8]), step([8, 8, 8, 8])]
    assert pilot.share_settled(measured)
    assert pilot.extrapolate(measured, later(6, 4)) == pilot.extrapolate(measured, later(6, 4, bound=False))
    # one step at 100% is not enough, nor a pilot of one step
    assert not pilot.share_settled([step([4, 4, 4, 4]), step([8, 8, 8, 8])])
    assert not pilot.share_settled([step([8, 8, 8, 8])])


def test_without_a_bound_the_band_is_statistical():
    # multi-turn recipes give no bound (their turns and tool outputs are the policy's)
    measured = [step([2, 4, 2, 4])]
    out = pilot.extrapolate(measured, later(3, 4, bound=False))["trained"]
    assert out[2] < sum(g["trained"] for g in measured[0]) + 3 * 4 * GROUP * (PROMPT + MAX_TOKENS)


def test_rl_part_bounds_only_single_turn_groups():
    class Cfg:
        group_size, max_tokens = GROUP, 3

    measured = {"steps": [step([2, 2])]}
    multi = pilot.rl_part(measured, Cfg, [[PROMPT, PROMPT], [PROMPT, 10]])
    single = pilot.rl_part(measured, Cfg, [[PROMPT, PROMPT], [PROMPT, 10]], single_turn=True)
    assert single["trained"][:2] == multi["trained"][:2]
    assert single["trained"][2] == 2 * (PROMPT + MAX_TOKENS - 1) * 2 + GROUP * (PROMPT + 3) + GROUP * (10 + 3)
