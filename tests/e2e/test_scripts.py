"""Whole user scripts in a fresh interpreter, with the SDK's defaults (telemetry on)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest

SCRIPT = textwrap.dedent(
    """
    import tinker
    from tinker import types

    sc = tinker.ServiceClient()
    tc = sc.create_lora_training_client(base_model="loops/tiny", rank=4).result(timeout=120)
    tok = tc.get_tokenizer()
    ids = tok.encode("hello telemetry", add_special_tokens=False)
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(ids[:-1]),
        loss_fn_inputs={"target_tokens": ids[1:], "weights": [1.0] * (len(ids) - 1)},
    )
    out = tc.forward_backward([datum], "cross_entropy").result(timeout=120)
    tc.optim_step(types.AdamParams(learning_rate=1e-3)).result(timeout=120)
    sampler = tc.save_weights_and_get_sampling_client().result(timeout=120)
    res = sampler.sample(
        types.ModelInput.from_ints(ids), 1, types.SamplingParams(max_tokens=4, seed=1)
    ).result(timeout=120)
    print("OK", out.metrics["loss:sum"], len(res.sequences[0].tokens))
    """
)


@pytest.mark.feature("telemetry")
def test_default_script_with_telemetry(loops_url, tmp_path):
    # TINKER_TELEMETRY unset = on: the SDK posts to /api/v1/telemetry and, if that
    # fails, retries forever and delays exit. The script must finish promptly.
    env = dict(os.environ)
    env.pop("TINKER_TELEMETRY", None)
    env["TINKER_BASE_URL"] = loops_url
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    start = time.time()
    proc = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300
    )
    elapsed = time.time() - start
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-4000:]}"
    assert proc.stdout.startswith("OK"), proc.stdout
    assert elapsed < 120, f"script took {elapsed:.0f}s (telemetry or shutdown stalls?)"
