"""The tinker 0.38 SDK trains through a 2-rank torch worker replica, unchanged: `loops serve
--backend torch` with a local pool of `gpus_per_replica=2` (GPU ids from a listed inventory,
the worker on the CPU, so gloo) starts each trainer replica as `--world-size 2`; a few
optimizer steps lower the loss and the saved weights sample on the sampler pool (a
multi-rank replica samples too when the model has no sampler pool). Equality with one rank is backends/torch's
test_shard.py and backends/worker's TestShardedReplica."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
import tinker  # noqa: E402
from tinker import types  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "tests"))
from conftest import API_KEY  # noqa: E402
from loops_server import running_server  # noqa: E402
from test_weights import _torch_python  # noqa: E402

TRAIN = [[5, 9, 33, 70, 11, 2, 17, 18], [8, 1, 300, 4, 19, 64, 3, 250, 6], [40, 41, 42]]


def _serve(label: str, ranks: int):
    """loops serve with a trainer pool of `ranks` GPUs per replica and a sampler pool."""
    py = _torch_python()
    if py is None:
        pytest.skip("no torch worker venv (LOOPS_TORCH_PYTHON)")
    args = ["--backend", "torch", "--model", "loops/tiny", "--backend-opt", f"python={py}",
            "--backend-opt", f"pythonpath={REPO_ROOT / 'backends' / 'torch'}{os.pathsep}{REPO_ROOT / 'gen' / 'python'}",
            "--backend-opt", "device=cpu", "--backend-opt", "args=--threads 1",
            "--backend-opt", "provider=local", "--backend-opt", f"gpus_per_replica={ranks}",
            "--backend-opt", "gpus=" + ",".join(str(i) for i in range(2 * ranks)), "--backend-opt", "sampler_replicas=1"]
    return running_server(label, extra_args=args)


def _ranks(data_dir: Path) -> list[list[str]]:
    """Command lines of the worker processes started as rank r > 0 for this server."""
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if "--rank" in argv and any(str(data_dir) in a for a in argv):
            out.append(argv)
    return out


def _train(url: str, monkeypatch) -> tuple[list[float], list[list[int]]]:
    """Four SFT steps with the SDK (the loss of each), then two seeded samples."""
    monkeypatch.setenv("TINKER_BASE_URL", url)
    tc = tinker.ServiceClient().create_lora_training_client(base_model="loops/tiny", rank=4, seed=3)
    data = [types.Datum(model_input=types.ModelInput.from_ints(s[:-1]),
                        loss_fn_inputs={"target_tokens": s[1:], "weights": [1.0] * (len(s) - 1)}) for s in TRAIN]
    losses = []
    for _ in range(4):
        out = tc.forward_backward(data, "cross_entropy").result()
        losses.append(out.metrics["loss:sum"])
        tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    sampler = tc.save_weights_and_get_sampling_client("sharded")
    res = sampler.sample(types.ModelInput.from_ints(TRAIN[0][:4]), num_samples=2,
                         sampling_params=types.SamplingParams(max_tokens=5, temperature=1.0, seed=11)).result()
    return losses, [s.tokens for s in res.sequences]


@pytest.mark.timeout(600)
def test_sdk_trains_through_two_ranks(monkeypatch):
    for k, v in {"TINKER_API_KEY": API_KEY, "TINKER_TELEMETRY": "0", "HF_HUB_OFFLINE": "1"}.items():
        monkeypatch.setenv(k, v)
    with _serve("sharded-torch", 2) as srv:
        ranks = _ranks(srv.log_path.parent)
        assert len(ranks) == 1 and "--world-size" in ranks[0], ranks  # rank 1 of the trainer replica
        assert ranks[0][ranks[0].index("--world-size") + 1] == "2"
        losses, samples = _train(srv.url, monkeypatch)
    assert losses[-1] < 0.9 * losses[0], losses
    assert all(len(s) > 0 for s in samples)
