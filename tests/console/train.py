"""A small tinker script for the console's browser test (tests/console).

Trains loops/tiny through the public tinker SDK: each step one supervised
forward_backward (cross_entropy), one RL forward_backward (importance_sampling, with
sampler logprobs deliberately far from the trainer's, so the run page shows the KL alert)
and one optim_step; it saves a training checkpoint after step 2 and at the end, and a
sampler checkpoint after step 4 and at the end, which it samples from once. Before the run it
creates an NLL eval (loops.v1 REST, /v1/evals) and attaches it through user_metadata
"loops.evals", so each sampler save is scored and the run page charts the scores. Usage: train.py STEPS SECONDS_BETWEEN_STEPS.
TINKER_BASE_URL and TINKER_API_KEY say where and as whom.
"""

from __future__ import annotations

import base64
import json
import os
import sys
import time
import urllib.request

import tinker
from tinker import types

TIMEOUT = 120


def datum(text: str) -> types.Datum:
    ids = list(text.encode("utf-8"))  # loops/tiny's tokenizer is byte-level
    return types.Datum(
        model_input=types.ModelInput.from_ints(ids[:-1]),
        loss_fn_inputs={"target_tokens": ids[1:], "weights": [1.0] * (len(ids) - 1)},
    )


def rl_datum(text: str, advantage: float) -> types.Datum:
    ids = list(text.encode("utf-8"))
    n = len(ids) - 1
    return types.Datum(
        model_input=types.ModelInput.from_ints(ids[:-1]),
        loss_fn_inputs={
            "target_tokens": ids[1:],
            "logprobs": [-1.0] * n,  # not the trainer's: kl_sample_train is large
            "advantages": [advantage] * n,
        },
    )


def create_eval(name: str) -> None:
    # Rows as token ids, the raw bytes this script trains on (held out: the same sentences).
    rows = [{"prompt": list(b"The quick brown"), "completion": list(b" fox")},
            {"prompt": list(b"A stitch in"), "completion": list(b" time")}]
    data = "".join(json.dumps(r) + "\n" for r in rows).encode()
    body = json.dumps({"name": name, "kind": "EVAL_KIND_NLL", "dataset": base64.b64encode(data).decode()}).encode()
    req = urllib.request.Request(os.environ["TINKER_BASE_URL"] + "/v1/evals", data=body, method="POST",
                                 headers={"X-Api-Key": os.environ["TINKER_API_KEY"], "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=TIMEOUT) as resp:
        assert resp.status == 200


def main() -> None:
    steps, pause = int(sys.argv[1]), float(sys.argv[2])
    service = tinker.ServiceClient()
    create_eval("heldout")
    tc = service.create_lora_training_client(
        base_model="loops/tiny", rank=4, user_metadata={"loops.evals": "heldout"}).result(timeout=TIMEOUT)
    print("run", tc.model_id, flush=True)
    batch = [datum("The quick brown fox jumps over the lazy dog."), datum("A stitch in time saves nine.")]
    rl = [rl_datum("two plus two is four", 1.0), rl_datum("two plus two is five", -1.0)]
    for step in range(1, steps + 1):
        fb = tc.forward_backward(batch, "cross_entropy")
        fb_rl = tc.forward_backward(rl, "importance_sampling")
        opt = tc.optim_step(types.AdamParams(learning_rate=2e-3))
        loss = fb.result(timeout=TIMEOUT).metrics["loss:sum"]
        fb_rl.result(timeout=TIMEOUT)
        opt.result(timeout=TIMEOUT)
        print(f"step {step} loss {loss:.4f}", flush=True)
        if step == 2:
            print("saved", tc.save_state("ck-early").result(timeout=TIMEOUT).path, flush=True)
        if step == 4:
            print("saved", tc.save_weights_for_sampler("sampler-mid").result(timeout=TIMEOUT).path, flush=True)
        time.sleep(pause)
    print("saved", tc.save_state("ck-final").result(timeout=TIMEOUT).path, flush=True)
    sampler_path = tc.save_weights_for_sampler("sampler-final").result(timeout=TIMEOUT).path
    print("saved", sampler_path, flush=True)
    sc = service.create_sampling_client(model_path=sampler_path)
    if hasattr(sc, "result"):  # tinker 0.38 hands back a future of the client
        sc = sc.result(timeout=TIMEOUT)
    out = sc.sample(
        prompt=types.ModelInput.from_ints(list(b"two plus two is")),
        num_samples=1,
        sampling_params=types.SamplingParams(max_tokens=8, temperature=1.0),
    ).result(timeout=TIMEOUT)
    print("sampled", len(out.sequences[0].tokens), "tokens", flush=True)
    print("done", flush=True)


if __name__ == "__main__":
    main()
