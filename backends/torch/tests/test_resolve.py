"""resolve_model_dir finds a model where the gateway's internal/hfcache finds it."""

import os

import huggingface_hub.constants
import pytest

from loops_worker.engine import resolve_model_dir

C1, C2 = "1" * 40, "2" * 40


def _snapshot(hub, commit, *files):
    d = os.path.join(hub, "models--org--m", "snapshots", commit)
    os.makedirs(d, exist_ok=True)
    for f in files:
        with open(os.path.join(d, f), "w") as fh:
            fh.write("{}")
    return d


def _ref(hub, commit):
    os.makedirs(os.path.join(hub, "models--org--m", "refs"), exist_ok=True)
    with open(os.path.join(hub, "models--org--m", "refs", "main"), "w") as fh:
        fh.write(commit)


def test_resolve_model_dir_as_hfcache(tmp_path, monkeypatch):
    hub = str(tmp_path / "hub")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", hub)
    with pytest.raises(FileNotFoundError, match="neither a folder with config.json"):
        resolve_model_dir("org/m")

    old = _snapshot(hub, C1, "config.json")
    os.utime(old, (1, 1))
    assert resolve_model_dir("org/m") == (old, "org/m"), "no main ref: the one snapshot"
    new = _snapshot(hub, C2, "config.json")
    assert resolve_model_dir("org/m") == (new, "org/m"), "no main ref: the most recent snapshot"
    _ref(hub, C1)
    assert resolve_model_dir("org/m") == (old, "org/m"), "main's snapshot"

    os.remove(os.path.join(old, "config.json"))
    assert resolve_model_dir("org/m") == (new, "org/m"), "main's snapshot lacks config.json: the one that has it"

    local = _snapshot(str(tmp_path / "local"), C1, "config.json")
    assert resolve_model_dir(local) == (local, local), "a folder is used as it is"

    for bad in ("../../etc", "a/b/c", "org--x/m"):
        with pytest.raises(FileNotFoundError):
            resolve_model_dir(bad)
