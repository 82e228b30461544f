"""Full fine-tuning through the tinker 0.38 SDK, unchanged: `create_lora_training_client(
base_model, rank=0)` against `loops serve --backend torch` with a workspace policy that sets
allow_full_finetune trains every weight of loops/tiny; the loss falls, the state checkpoint
resumes the run, and the sampler checkpoint (a Hugging Face model folder) samples and gives
the trained model's log-probs. The numerics (float64 AdamW equality, the folder loading in
transformers, bit-identical resume) are backends/torch's test_full.py; the refusals (policy,
replica memory, reference engine) are the Go tests."""

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


@pytest.mark.timeout(600)
def test_sdk_full_finetune(monkeypatch, tmp_path):
    py = _torch_python()
    if py is None:
        pytest.skip("no torch worker venv (LOOPS_TORCH_PYTHON)")
    for k, v in {"TINKER_API_KEY": API_KEY, "TINKER_TELEMETRY": "0", "HF_HUB_OFFLINE": "1"}.items():
        monkeypatch.setenv(k, v)
    policy = tmp_path / "policy.yaml"
    policy.write_text("default:\n  allow_full_finetune: true\n")
    args = ["--backend", "torch", "--model", "loops/tiny", "--backend-opt", f"python={py}",
            "--backend-opt", f"pythonpath={REPO_ROOT / 'backends' / 'torch'}{os.pathsep}{REPO_ROOT / 'gen' / 'python'}",
            "--backend-opt", "device=cpu", "--backend-opt", "args=--threads 1 --full-finetune-runs 2",
            "--workspace-policy", str(policy)]
    with running_server("fullft-torch", extra_args=args) as srv:
        monkeypatch.setenv("TINKER_BASE_URL", srv.url)
        sc = tinker.ServiceClient()
        tc = sc.create_lora_training_client(base_model="loops/tiny", rank=0)
        data = [types.Datum(model_input=types.ModelInput.from_ints(s[:-1]),
                            loss_fn_inputs={"target_tokens": s[1:], "weights": [1.0] * (len(s) - 1)}) for s in TRAIN]
        losses = []
        for step in range(4):
            out = tc.forward_backward(data, "cross_entropy").result()
            losses.append(out.metrics["loss:sum"])
            tc.optim_step(types.AdamParams(learning_rate=2e-3)).result()
            if step == 1:
                state = tc.save_state("full-2").result().path
        assert losses[-1] < 0.9 * losses[0], losses
        # the trained model, as the training client sees it
        fwd = tc.forward([data[1]], "cross_entropy").result()
        want = [float(x) for x in fwd.loss_fn_outputs[0]["logprobs"].tolist()]
        sampler = tc.save_weights_and_get_sampling_client("full-s")
        got = sampler.compute_logprobs(types.ModelInput.from_ints(TRAIN[1])).result()
        assert got[0] is None
        assert max(abs(a - b) for a, b in zip(got[1:], want)) < 1e-4, (got, want)
        res = sampler.sample(types.ModelInput.from_ints(TRAIN[0][:4]), num_samples=2,
                             sampling_params=types.SamplingParams(max_tokens=5, temperature=1.0, seed=11)).result()
        assert all(len(s.tokens) > 0 for s in res.sequences)
        # a new run from the state after 2 steps takes step 3 to the same loss (a second full
        # run on the replica: the worker holds --full-finetune-runs of them)
        tc2 = sc.create_training_client_from_state(state)
        again = tc2.forward_backward(data, "cross_entropy").result().metrics["loss:sum"]
        assert abs(again - losses[2]) <= 1e-4 * abs(losses[2]), (again, losses)
