"""tests/ray/drive.py: a tinker script the Ray pool test (ray_test.go) drives line by line.

Commands on stdin: `step` (forward_backward + optim_step on loops/tiny), `steps N` (N steps
back to back, or fewer once the file LOOPS_DRIVE_STOP exists, then `steps_done`), `save NAME` (save_state), `sample NAME`
(save_weights_and_get_sampling_client + sample), `shadow N` (a second training client with
the same seed and data takes N steps undisturbed and prints its losses), `dedicated` (a new
session creates a run with a dedicated pool and takes a step — timed together — and ends,
releasing the pool), `quit`. A failed
call is printed and retried; when the gateway says the run's adapter was lost ("load the
run's last checkpoint"), the script does what a user script does: load_state of its last
saved state, then retries. Every outcome is one JSON line on stdout, so the test log shows
exactly what a script sees while replicas die.
"""

import json
import os
import sys
import time

import tinker
from tinker import types

BASE = "loops/tiny"


def out(**kw):
    kw["t"] = round(time.time(), 3)
    print(json.dumps(kw), flush=True)


STATE = {"last": None}
# `steps N` ends early once this file exists (LOOPS_DRIVE_STOP), so the test can keep the
# script training for as long as a failure takes to play out.
STOP = os.environ.get("LOOPS_DRIVE_STOP", "")


def corrupted(tc):
    """Whether the gateway marked the run corrupted (its adapter was recreated empty)."""
    try:
        return bool(tinker.RestClient().get_training_run(tc.model_id).result(timeout=60).corrupted)
    except Exception as e:  # noqa: BLE001
        out(event="error", what="get_training_run", error=f"{type(e).__name__}: {str(e)[:300]}")
        return False


def retry(tc, what, fn, tries=120):
    t0 = time.time()
    for attempt in range(tries):
        try:
            res = fn()
            # after errors, the call may have run on an adapter the gateway recreated empty
            # (the run is then marked corrupted): reload the last state and do it again
            if attempt > 0 and STATE["last"] and corrupted(tc):
                tc.load_state(STATE["last"]).result(timeout=300)
                out(event="reloaded", path=STATE["last"], why="the run was marked corrupted")
                continue
            return res, time.time() - t0
        except Exception as e:  # noqa: BLE001 - the point is to show what the script sees
            msg = str(e)
            out(event="error", what=what, attempt=attempt, error=f"{type(e).__name__}: {msg[:300]}")
            if ("last checkpoint" in msg or "load_state" in msg) and STATE["last"]:
                try:
                    tc.load_state(STATE["last"]).result(timeout=300)
                    out(event="reloaded", path=STATE["last"])
                    continue
                except Exception as e2:  # noqa: BLE001
                    out(event="error", what="load_state", error=f"{type(e2).__name__}: {str(e2)[:300]}")
            time.sleep(1.0)
    raise RuntimeError(f"{what} failed {tries} times")


def main():
    sc = tinker.ServiceClient()
    tc = sc.create_lora_training_client(base_model=BASE, rank=4, seed=7)
    tok = tc.get_tokenizer()
    ids = [int(i) for i in tok.encode("the pool keeps training while replicas come and go", add_special_tokens=False)]
    datum = types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]),
                        loss_fn_inputs={"target_tokens": ids[1:], "weights": [1.0] * (len(ids) - 1)})
    out(event="ready", tokens=len(ids))

    def step(tc=tc):
        fb = tc.forward_backward([datum], "cross_entropy")
        opt = tc.optim_step(types.AdamParams(learning_rate=1e-2))
        r = fb.result(timeout=300)
        opt.result(timeout=300)
        return float(r.metrics["loss:sum"])

    n = 0
    for line in sys.stdin:
        cmd, _, arg = line.strip().partition(" ")
        if cmd in ("step", "steps"):
            for _ in range(int(arg or 1)):
                if cmd == "steps" and STOP and os.path.exists(STOP):
                    break  # the test has seen what it waited for
                loss, secs = retry(tc, "step", step)
                n += 1
                out(event="step", step=n, loss=loss, secs=round(secs, 3))
            if cmd == "steps":
                out(event="steps_done", step=n)
        elif cmd == "save":
            path, secs = retry(tc, "save", lambda: tc.save_state(arg).result(timeout=300).path)
            STATE["last"] = path
            out(event="saved", path=path, secs=round(secs, 3))
        elif cmd == "sample":
            def sample():
                s = tc.save_weights_and_get_sampling_client(arg)
                r = s.sample(types.ModelInput.from_ints(ids[:4]), num_samples=1,
                             sampling_params=types.SamplingParams(max_tokens=8, temperature=0.0, seed=1)).result(timeout=300)
                return r.sequences[0].tokens
            toks, secs = retry(tc, "sample", sample)
            out(event="sampled", tokens=toks, secs=round(secs, 3))
        elif cmd == "shadow":
            sh = sc.create_lora_training_client(base_model=BASE, rank=4, seed=7)
            losses = [step(sh) for _ in range(int(arg))]
            out(event="shadow", losses=losses)
        elif cmd == "dedicated":
            t0 = time.time()
            with tinker.ServiceClient() as sc2:
                dc = sc2.create_lora_training_client(base_model=BASE, rank=4, seed=7, user_metadata={"loops.dedicated": "true"})
                loss = step(dc)  # waits for the run's creation, then its first step
                secs = time.time() - t0
            out(event="dedicated", secs=round(secs, 3), loss=loss)
        elif cmd == "quit":
            break
    out(event="bye")


if __name__ == "__main__":
    os.environ.setdefault("TINKER_API_KEY", "tml-ray-test")
    main()
