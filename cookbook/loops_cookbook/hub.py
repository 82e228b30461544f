"""Offline when it can be: a recipe needs only its model's tokenizer from the Hugging Face hub.

With no network, transformers retries each hub request five times with back-off before it
falls back to the local cache: about two and a half minutes per `check` or `run` although the
tokenizer is right there. When the tokenizer is already cached and the user has not said
otherwise (HF_HUB_OFFLINE unset), the recipe runs with HF_HUB_OFFLINE=1. This must run before
huggingface_hub is imported: it reads the variable once, at import."""

from __future__ import annotations

import os
import sys
from pathlib import Path

# Files one of which a cached tokenizer has.
_TOKENIZER_FILES = ("tokenizer_config.json", "tokenizer.json")


def hub_cache() -> Path:
    """The hub cache folder as huggingface_hub resolves it (HF_HUB_CACHE, HF_HOME, XDG_CACHE_HOME)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    if os.environ.get("HUGGINGFACE_HUB_CACHE"):
        return Path(os.environ["HUGGINGFACE_HUB_CACHE"])
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]) / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "huggingface" / "hub"


def tokenizer_cached(model: str) -> bool:
    """Whether a snapshot of the model's hub repo in the cache has its tokenizer."""
    if not model or model.count("/") != 1 or os.path.isdir(model):
        return False
    snapshots = hub_cache() / ("models--" + model.replace("/", "--")) / "snapshots"
    try:
        return any((snap / f).is_file() for snap in snapshots.iterdir() for f in _TOKENIZER_FILES)
    except OSError:
        return False


def offline_when_cached(model: str) -> bool:
    """Sets HF_HUB_OFFLINE=1 when the model's tokenizer is cached and HF_HUB_OFFLINE is unset;
    returns whether it did. HF_HUB_OFFLINE=0 keeps the hub in use (a newer tokenizer revision)."""
    if "HF_HUB_OFFLINE" in os.environ or "huggingface_hub" in sys.modules or not tokenizer_cached(model):
        return False
    os.environ["HF_HUB_OFFLINE"] = "1"
    return True
