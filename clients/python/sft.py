"""A short SFT loop and a sample against a Loops server over gRPC, with the Python stubs
generated from proto/loops/v1 (gen/python, scripts/gen-python.sh) and grpcio.

    LOOPS_URL=http://127.0.0.1:PORT LOOPS_API_KEY=tml-anything python sft.py

Mirrors gateway/server_test.go TestConnectTrainsAndSamples: create a LoRA run on loops/tiny,
three forward_backward + optim_step steps with cross_entropy (the loss must fall), save
sampler weights, sample 2 sequences of at most 5 tokens (one logprob per token). Exits 1 on
any failure.
"""

from __future__ import annotations

import math
import os
import sys
import time
from urllib.parse import urlparse

_GEN = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "gen", "python"))
if _GEN not in sys.path:
    sys.path.insert(0, _GEN)

import grpc  # noqa: E402
from google.protobuf import duration_pb2  # noqa: E402

from loops.v1 import operations_pb2 as opb  # noqa: E402
from loops.v1 import operations_pb2_grpc as opb_grpc  # noqa: E402
from loops.v1 import resources_pb2 as rpb  # noqa: E402
from loops.v1 import services_pb2 as spb  # noqa: E402
from loops.v1 import services_pb2_grpc as spb_grpc  # noqa: E402
from loops.v1 import types_pb2 as tpb  # noqa: E402

CALL_TIMEOUT_S = 60.0


class CheckFailed(Exception):
    pass


def check(cond: bool, msg: str) -> None:
    if not cond:
        raise CheckFailed(msg)


def tokens(n: int) -> tuple[list[int], list[int], list[float]]:
    """The same 16-token sequence as the Go test: position i predicts token i+1."""
    inp = [65 + i % 20 for i in range(n)]
    tgt = [65 + (i + 1) % 20 for i in range(n)]
    return inp, tgt, [1.0] * n


def main() -> int:
    url = urlparse(os.environ.get("LOOPS_URL", "http://127.0.0.1:8080"))
    check(url.scheme == "http", f"plaintext (h2c) URL expected, got {url.geturl()}")
    md = (("x-api-key", os.environ.get("LOOPS_API_KEY", "tml-anything")),)
    t0 = time.monotonic()
    with grpc.insecure_channel(url.netloc) as ch:
        models = spb_grpc.ModelServiceStub(ch)
        training = spb_grpc.TrainingServiceStub(ch)
        sampling = spb_grpc.SamplingServiceStub(ch)
        ops = opb_grpc.OperationServiceStub(ch)

        def call(method, req):
            return method(req, metadata=md, timeout=CALL_TIMEOUT_S)

        def wait(op: opb.Operation) -> opb.Operation:
            done = (opb.OPERATION_STATE_SUCCEEDED, opb.OPERATION_STATE_FAILED, opb.OPERATION_STATE_CANCELLED)
            while op.state not in done:
                op = call(ops.WaitOperation, opb.WaitOperationRequest(id=op.id, timeout=duration_pb2.Duration(seconds=10)))
            check(op.state == opb.OPERATION_STATE_SUCCEEDED, f"operation {op.id} failed: {op.error.message}")
            return op

        listed = call(models.ListModels, spb.ListModelsRequest())
        check(any(m.name == "loops/tiny" for m in listed.models), "loops/tiny is listed")

        created = wait(call(training.CreateTrainingRun, spb.CreateTrainingRunRequest(
            base_model="loops/tiny", lora=tpb.LoraConfig(rank=4, seed=1, train_attn=True, train_mlp=True))))
        check(created.WhichOneof("result") == "training_run", "create returned a training run")
        run = created.training_run.id
        print(f"training run {run}")

        inp, tgt, w = tokens(16)
        datum = tpb.Datum(tokens=inp, loss_fn_inputs={
            "target_tokens": tpb.Tensor(dtype=tpb.DTYPE_INT64, int64_data=tgt),
            "weights": tpb.Tensor(dtype=tpb.DTYPE_FLOAT32, float32_data=w),
        })
        losses: list[float] = []
        for step in range(3):
            # Submit both, then wait: the server runs a run's work in submission order.
            fb = call(training.ForwardBackward, spb.ForwardBackwardRequest(
                training_run_id=run, data=[datum], loss_fn="cross_entropy"))
            opt = call(training.OptimStep, spb.OptimStepRequest(
                training_run_id=run, adam=tpb.AdamParams(learning_rate=1e-2, beta1=0.9, beta2=0.95, eps=1e-12)))
            done = wait(fb)
            check(done.WhichOneof("result") == "forward_backward", "forward_backward result")
            res = done.forward_backward
            check(len(res.outputs) == 1, "one output per datum")
            check(len(res.outputs[0].outputs["logprobs"].float32_data) == 16, "16 logprobs")
            loss = res.metrics["loss:sum"]
            check(math.isfinite(loss), "loss:sum is finite")
            losses.append(loss)
            wait(opt)
            print(f"step {step}: loss:sum {loss:.4f}")
        check(losses[2] < losses[0], f"loss should fall: {losses}")

        saved = wait(call(training.SaveWeights, spb.SaveWeightsRequest(
            training_run_id=run, kind=rpb.CHECKPOINT_KIND_SAMPLER)))
        check(saved.WhichOneof("result") == "save_weights", "save_weights result")
        sampler_id = saved.save_weights.sampler_id
        check(sampler_id != "", "an unnamed sampler save returns a sampler id")

        sampled = wait(call(sampling.Sample, spb.SampleRequest(
            sampler_id=sampler_id, prompt=inp[:4], num_samples=2,
            params=tpb.SamplingParams(max_tokens=5, temperature=1, top_p=1, seed=7))))
        check(sampled.WhichOneof("result") == "sample", "sample result")
        seqs = sampled.sample.sequences
        check(len(seqs) == 2, f"2 sequences, got {len(seqs)}")
        for s in seqs:
            check(1 <= len(s.tokens) <= 5, f"1..5 tokens, got {len(s.tokens)}")
            check(len(s.logprobs) == len(s.tokens), "one logprob per token")
            check(all(0 <= t < 512 for t in s.tokens), "token ids in the vocabulary")
            print(f"sample: tokens {list(s.tokens)}")

        # A missing run is NOT_FOUND, and no key is UNAUTHENTICATED: gRPC status codes map.
        try:
            training.GetTrainingRun(spb.GetTrainingRunRequest(id="run-nope"), metadata=md, timeout=CALL_TIMEOUT_S)
            check(False, "GetTrainingRun(run-nope) should fail")
        except grpc.RpcError as e:
            check(e.code() == grpc.StatusCode.NOT_FOUND, f"NOT_FOUND expected, got {e.code()}")
    ms = round((time.monotonic() - t0) * 1000)
    print(f"python client: OK (losses {', '.join(f'{x:.4f}' for x in losses)}; {ms} ms)")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (CheckFailed, grpc.RpcError) as e:
        print(f"python client: FAILED: {e!r}", file=sys.stderr)
        sys.exit(1)
