"""The one list of recipes. `python -m loops_cookbook list --json` prints it; the Go command
`loops cookbook list` reads that output, so the list is written only here."""

from __future__ import annotations

import dataclasses
import importlib
from types import ModuleType

# name -> one-line summary. The module is loops_cookbook.recipes.<name>.
RECIPES: dict[str, str] = {
    "sft_chat": "Supervised fine-tuning on chat JSONL, with a held-out eval loss",
    "tool_calling": "SFT on tool-call transcripts, then RL with the calls executed against local Python tools",
    "sandboxed_agent": "Multi-turn RL: the policy runs shell/Python commands in a sandbox; reward from the final state",
    "coding_agent": "RL: the policy writes a function; reward = share of hidden unit tests passing in the sandbox",
    "dpo": "Direct preference optimisation on (prompt, chosen, rejected) pairs",
    "vision_sft": "Supervised fine-tuning of a vision-language model on pictures it draws (colour -> word), with a held-out eval loss",
    "rl_async": "RL on verifiable prompt/answer tasks, off-policy with bounded staleness (0 = synchronous)",
}


def load(name: str) -> ModuleType:
    """Imports a recipe's module; KeyError names the known recipes."""
    if name not in RECIPES:
        raise KeyError(f"unknown recipe {name!r}; known: {', '.join(RECIPES)}")
    return importlib.import_module(f"loops_cookbook.recipes.{name}")


def describe(name: str) -> dict:
    """A recipe's summary, description, data format and config fields (name, type, default, help)."""
    mod = load(name)
    fields = []
    for f in dataclasses.fields(mod.Config):
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else None)  # type: ignore[misc]
        fields.append({"name": f.name, "type": f.type if isinstance(f.type, str) else f.type.__name__,
                       "default": default, "help": f.metadata.get("help", "")})
    return {
        "name": name,
        "summary": RECIPES[name],
        "description": (mod.__doc__ or "").strip(),
        "data_format": mod.DATA_FORMAT.strip(),
        "sandbox": bool(getattr(mod, "USES_SANDBOX", False)),
        "config": fields,
    }
