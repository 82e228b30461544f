"""What an RL environment is (no tinker import, so configs and envs load without the SDK).

An environment plays one episode: `reset()` returns the prompt tokens; `step(action_tokens)`
returns a Step: done, reward (the episode's reward so far; the last step's counts), the tokens
that continue the conversation (when not done), and metrics. An env may also have `close()`,
called once the episode ends.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol


@dataclasses.dataclass
class Step:
    """What an environment answers to one action."""

    done: bool
    reward: float = 0.0
    next_tokens: list[int] = dataclasses.field(default_factory=list)
    metrics: dict[str, float] = dataclasses.field(default_factory=dict)


class Env(Protocol):
    def reset(self) -> list[int]: ...

    def step(self, action: list[int]) -> Step: ...


@dataclasses.dataclass
class Episode:
    tokens: list[int]
    logprobs: list[float]
    mask: list[float]
    reward: float = 0.0
    metrics: dict[str, float] = dataclasses.field(default_factory=dict)
    turns: int = 0
    sampler_step: int = 0
    # What the episode's sample requests were metered: prompt tokens (prefill, once per
    # request; a one-turn group's shared request is counted on its first episode) and the
    # part of them served from the server's prefix cache. prompt: the first prompt's length.
    prompt: int = 0
    prefill: int = 0
    cached: int = 0
