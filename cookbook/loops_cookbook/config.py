"""Config dataclasses shared by the recipes, and `key=value` overrides from the command line."""

from __future__ import annotations

import dataclasses
import os
import time
from importlib import resources
from pathlib import Path
from typing import Any


def field(default: Any, help: str) -> Any:
    """A config field with a documented default (the help text shows in `show`)."""
    return dataclasses.field(default=default, metadata={"help": help})


@dataclasses.dataclass
class BaseConfig:
    """Fields every recipe has."""

    base_url: str | None = field(None, "server URL; default: TINKER_BASE_URL (the SDK reads it)")
    model: str = field("loops/tiny", "base model to fine-tune (LoRA)")
    lora_rank: int = field(8, "LoRA rank")
    learning_rate: float = field(1e-3, "Adam learning rate (constant)")
    steps: int = field(20, "optimizer steps to run")
    seed: int = field(0, "seed for data order, LoRA init and sampling")
    log_dir: str | None = field(None, "where config.json, metrics.jsonl and checkpoints.jsonl go; default runs/<recipe>-<time>")
    save_every: int = field(0, "save a checkpoint (state + sampler weights) every N steps; 0 = only the final one")
    max_length: int = field(512, "longest training sequence in tokens; longer examples are truncated (check counts them)")
    progress: bool = field(True, "show a progress bar on stderr")
    resume: str | None = field(None, "continue the run logged in this folder from its last checkpoint (a pilot's, or a save_every one), with its config (`run NAME --resume DIR`)")


@dataclasses.dataclass
class RLConfig(BaseConfig):
    """Fields every RL recipe has."""

    group_size: int = field(8, "episodes per task (advantages are relative to the group mean)")
    groups_per_batch: int = field(8, "tasks per training step")
    max_tokens: int = field(64, "tokens sampled per turn")
    temperature: float = field(1.0, "sampling temperature")
    concurrency: int = field(16, "episodes played at once")


def apply_overrides(cfg: Any, pairs: list[str]) -> Any:
    """Returns cfg with `key=value` pairs applied, each converted to the field's type."""
    types = {f.name: f.type for f in dataclasses.fields(cfg)}
    changes: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep:
            raise ValueError(f"{pair!r}: want key=value (fields: {', '.join(types)})")
        if key not in types:
            raise ValueError(f"unknown config field {key!r}; fields: {', '.join(types)}")
        changes[key] = _convert(key, str(types[key]), raw)
    return dataclasses.replace(cfg, **changes)


def _convert(key: str, typ: str, raw: str) -> Any:
    optional = "None" in typ
    if optional and raw.lower() in ("", "none", "null"):
        return None
    base = typ.replace("| None", "").replace("None |", "").strip()
    try:
        if base == "bool":
            if raw.lower() in ("1", "true", "yes", "on"):
                return True
            if raw.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(raw)
        if base == "int":
            return int(raw)
        if base == "float":
            return float(raw)
    except ValueError:
        raise ValueError(f"{key}={raw!r}: want a {base}") from None
    return raw


def sample_data(name: str) -> str:
    """The path of a sample data file shipped in the package (loops_cookbook/data/NAME)."""
    return str(resources.files("loops_cookbook") / "data" / name)


def resolve_data(value: str | None, sample: str) -> str:
    """A data path from the config, or the bundled sample when it is unset."""
    return value if value else sample_data(sample)


def log_dir_for(recipe: str, cfg: BaseConfig) -> Path:
    """The run's log folder: cfg.log_dir, or runs/<recipe>-<UTC time> under the current folder."""
    if cfg.log_dir:
        return Path(cfg.log_dir)
    return Path("runs") / f"{recipe}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}"


def base_url(cfg: BaseConfig) -> str | None:
    """The server URL: the config's, else TINKER_BASE_URL (None lets the SDK decide)."""
    return cfg.base_url or os.environ.get("TINKER_BASE_URL")
