"""Receipts and replay (docs/receipts.md) from an unmodified tinker script: the run's
receipt names the SDK from its headers, lists every step, and `loops runs replay` runs it
again bit for bit."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import tinker
from tinker import types

from e2e_helpers import BASE_MODEL, RESULT_TIMEOUT, loss_sum, result, sft_batch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from loops_server import loops_binary  # noqa: E402
from conftest import API_KEY  # noqa: E402


def loops(url: str, key: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(loops_binary()), "runs", *args, "--url", url, "--api-key", key],
                          capture_output=True, text=True, timeout=300)


def test_receipt_and_replay(loops_url, service_client, tokenizer):
    tc = result(service_client.create_lora_training_client(
        base_model=BASE_MODEL, rank=8, seed=7, user_metadata={"loops.record_data": "true"}))
    batch = sft_batch(tokenizer)
    losses = []
    for _ in range(3):
        fb = tc.forward_backward(batch[: 1 + len(losses)], "cross_entropy")
        opt = tc.optim_step(types.AdamParams(learning_rate=1e-3))
        losses.append(loss_sum(result(fb)))
        result(opt)
    tc.save_state("after-3").result(timeout=RESULT_TIMEOUT)

    out = loops(loops_url, API_KEY, "receipt", tc.model_id)
    assert out.returncode == 0, out.stderr
    rec = json.loads(out.stdout)
    assert rec["client"]["name"] == "tinker"
    assert rec["client"]["version"] == tinker.__version__
    assert rec["client"]["runtime"].startswith("CPython")
    assert rec["base_model_revision"].startswith("sha256:")
    assert rec["lora"]["seed"] == "7" and rec["lora"]["rank"] == 8
    assert rec["record_data"] is True
    kinds = [s["kind"] for s in rec["steps"]]
    assert kinds == ["OPERATION_KIND_FORWARD_BACKWARD", "OPERATION_KIND_OPTIM_STEP"] * 3 + ["OPERATION_KIND_SAVE_WEIGHTS"]
    fbs = [s for s in rec["steps"] if s["kind"] == "OPERATION_KIND_FORWARD_BACKWARD"]
    # The receipt's loss is the one the SDK got (the SDK sums the chunks' loss:sum).
    assert [s["loss"] for s in fbs] == losses
    assert len({s["batch_sha256"] for s in fbs}) == 3
    assert rec["steps"][-1]["checkpoint_path"] == f"tinker://{tc.model_id}/weights/after-3"

    out = loops(loops_url, API_KEY, "replay", "-q", tc.model_id)
    assert out.returncode == 0, out.stdout + out.stderr
    rep = json.loads(out.stdout)
    assert rep["matched"] is True and rep["replayed"] == 6 and rep["forward_backwards"] == 3

    # Another key's workspace has no such run.
    out = loops(loops_url, "tml-e2e-someone-else", "receipt", tc.model_id)
    assert out.returncode != 0 and "not found" in out.stderr.lower(), out.stderr
