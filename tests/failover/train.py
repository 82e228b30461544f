"""A tinker SDK training loop that survives a gateway failover (tests/failover).

It trains loops/tiny through TINKER_BASE_URL (the front that reaches both gateways) for
STEPS steps of forward_backward + optim_step, saves its state every SAVE_EVERY steps, and
prints one JSON line per event on stdout, which the Go harness reads:
  {"event": "step", "step": N, "loss": L}
  {"event": "saved", "step": N, "path": P}
  {"event": "error", "step": N, "error": "...", "seconds": S}   an operation failed
  {"event": "resumed", "step": N, "path": P, "seconds": S}     state reloaded, carrying on
  {"event": "done", "steps": N, "failovers": K}
When an operation fails (the gateway that ran it died), it reloads the last saved state
(load_state_with_optimizer) and carries on from the step after that save, as a user's
script restarting from its last checkpoint would.
"""

from __future__ import annotations

import json
import os
import sys
import time
import warnings

import tinker
from tinker import types

STEPS = int(os.environ.get("STEPS", "30"))
SAVE_EVERY = int(os.environ.get("SAVE_EVERY", "3"))
TIMEOUT = float(os.environ.get("RESULT_TIMEOUT", "120"))
MAX_FAILURES = int(os.environ.get("MAX_FAILURES", "20"))


def emit(**kw) -> None:
    print(json.dumps(kw), flush=True)


def datum(tokens: list[int]) -> types.Datum:
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)},
    )


def main() -> int:
    batch = [datum(list(s.encode())) for s in ("The quick brown fox jumps over the lazy dog.", "A stitch in time saves nine.")]
    adam = types.AdamParams(learning_rate=1e-2)
    sc = tinker.ServiceClient()
    tc = sc.create_lora_training_client(base_model="loops/tiny", rank=4, seed=1)
    tc = tc.result() if hasattr(tc, "result") else tc
    last_path, last_saved = None, 0
    step, failures, failovers = 0, 0, 0
    while step < STEPS:
        t0 = time.monotonic()
        try:
            fb = tc.forward_backward(batch, "cross_entropy")
            opt = tc.optim_step(adam)
            loss = fb.result(timeout=TIMEOUT).metrics["loss:sum"]
            opt.result(timeout=TIMEOUT)
            step += 1
            emit(event="step", step=step, loss=loss)
            if step % SAVE_EVERY == 0:
                last_path = tc.save_state(f"step-{step}").result(timeout=TIMEOUT).path
                last_saved = step
                emit(event="saved", step=step, path=last_path)
        except Exception as e:  # noqa: BLE001 - any failure of the gateway that ran it
            failures += 1
            emit(event="error", step=step, error=f"{type(e).__name__}: {e}"[:600], seconds=round(time.monotonic() - t0, 3))
            if failures > MAX_FAILURES:
                return 1
            while True:  # reload the last checkpoint (or start over) and carry on
                try:
                    if last_path is not None:
                        with warnings.catch_warnings():
                            warnings.simplefilter("ignore", FutureWarning)
                            tc.load_state_with_optimizer(last_path).result(timeout=TIMEOUT)
                    else:
                        tc = sc.create_lora_training_client(base_model="loops/tiny", rank=4, seed=1)
                        tc = tc.result() if hasattr(tc, "result") else tc
                    break
                except Exception as e2:  # noqa: BLE001
                    failures += 1
                    emit(event="error", step=step, error=f"reloading: {type(e2).__name__}: {e2}"[:600], seconds=round(time.monotonic() - t0, 3))
                    if failures > MAX_FAILURES:
                        return 1
                    time.sleep(0.5)
            failovers += 1
            step = last_saved
            emit(event="resumed", step=step, path=last_path, seconds=round(time.monotonic() - t0, 3))
    emit(event="done", steps=step, failovers=failovers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
