// A short SFT loop and a sample against a Loops server, over Connect, with the TypeScript
// client generated from proto/loops/v1 by protoc-gen-es (gen/ts) and connect-es.
//
//   LOOPS_URL=http://127.0.0.1:PORT LOOPS_API_KEY=tml-anything npx tsx sft.ts
//
// Mirrors gateway/server_test.go TestConnectTrainsAndSamples: create a LoRA run on loops/tiny,
// three forward_backward + optim_step steps with cross_entropy (the loss must fall), save
// sampler weights, sample 2 sequences of at most 5 tokens (one logprob per token). Exits 1 on
// any failure.
import { create } from "@bufbuild/protobuf";
import { DurationSchema } from "@bufbuild/protobuf/wkt";
import { type Client, Code, ConnectError, type Interceptor, createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { type Operation, OperationService, OperationState } from "../../gen/ts/loops/v1/operations_pb.js";
import { CheckpointKind } from "../../gen/ts/loops/v1/resources_pb.js";
import { ModelService, SamplingService, TrainingService } from "../../gen/ts/loops/v1/services_pb.js";
import { DatumSchema, Dtype, TensorSchema } from "../../gen/ts/loops/v1/types_pb.js";

const baseUrl = process.env.LOOPS_URL ?? "http://127.0.0.1:8080";
const apiKey = process.env.LOOPS_API_KEY ?? "tml-anything";

function check(cond: boolean, msg: string): asserts cond {
  if (!cond) throw new Error(`check failed: ${msg}`);
}

const withKey: Interceptor = (next) => async (req) => {
  req.header.set("X-API-Key", apiKey);
  return next(req);
};
const transport = createConnectTransport({ baseUrl, httpVersion: "1.1", interceptors: [withKey] });
const models = createClient(ModelService, transport);
const training = createClient(TrainingService, transport);
const sampling = createClient(SamplingService, transport);
const ops: Client<typeof OperationService> = createClient(OperationService, transport);

// wait long-polls an operation until it finishes and requires success.
async function wait(op: Operation): Promise<Operation> {
  while (op.state !== OperationState.SUCCEEDED && op.state !== OperationState.FAILED) {
    op = await ops.waitOperation({ id: op.id, timeout: create(DurationSchema, { seconds: 10n }) });
  }
  check(op.state === OperationState.SUCCEEDED, `operation ${op.id} failed: ${op.error?.message}`);
  return op;
}

// The same 16-token sequence as the Go test: position i predicts token i+1.
function tokens(n: number): { input: number[]; targets: bigint[]; weights: number[] } {
  const input: number[] = [];
  const targets: bigint[] = [];
  const weights: number[] = [];
  for (let i = 0; i < n; i++) {
    input.push(65 + (i % 20));
    targets.push(BigInt(65 + ((i + 1) % 20)));
    weights.push(1);
  }
  return { input, targets, weights };
}

async function main(): Promise<void> {
  const t0 = performance.now();
  const listed = await models.listModels({});
  check(listed.models.some((m) => m.name === "loops/tiny"), "loops/tiny is listed");

  const created = await wait(
    await training.createTrainingRun({
      baseModel: "loops/tiny",
      lora: { rank: 4, seed: 1n, trainAttn: true, trainMlp: true },
    }),
  );
  check(created.result.case === "trainingRun", "create returned a training run");
  const run = created.result.value.id;
  console.log(`training run ${run}`);

  const { input, targets, weights } = tokens(16);
  const datum = create(DatumSchema, {
    tokens: input,
    lossFnInputs: {
      target_tokens: create(TensorSchema, { dtype: Dtype.INT64, int64Data: targets }),
      weights: create(TensorSchema, { dtype: Dtype.FLOAT32, float32Data: weights }),
    },
  });
  const losses: number[] = [];
  for (let step = 0; step < 3; step++) {
    // Submit both, then wait: the server runs a run's work in submission order.
    const fb = await training.forwardBackward({ trainingRunId: run, data: [datum], lossFn: "cross_entropy" });
    const opt = await training.optimStep({
      trainingRunId: run,
      adam: { learningRate: 1e-2, beta1: 0.9, beta2: 0.95, eps: 1e-12 },
    });
    const done = await wait(fb);
    check(done.result.case === "forwardBackward", "forward_backward result");
    const res = done.result.value;
    check(res.outputs.length === 1, "one output per datum");
    check(res.outputs[0].outputs["logprobs"]?.float32Data.length === 16, "16 logprobs");
    const loss = res.metrics["loss:sum"];
    check(typeof loss === "number" && Number.isFinite(loss), "loss:sum is a finite number");
    losses.push(loss);
    await wait(opt);
    console.log(`step ${step}: loss:sum ${loss.toFixed(4)}`);
  }
  check(losses[2] < losses[0], `loss should fall: ${losses.join(", ")}`);

  const saved = await wait(await training.saveWeights({ trainingRunId: run, kind: CheckpointKind.SAMPLER }));
  check(saved.result.case === "saveWeights", "save_weights result");
  const samplerId = saved.result.value.samplerId;
  check(samplerId !== "", "an unnamed sampler save returns a sampler id");

  const sampled = await wait(
    await sampling.sample({
      samplerId,
      prompt: input.slice(0, 4),
      numSamples: 2,
      params: { maxTokens: 5, temperature: 1, topP: 1, seed: 7n },
    }),
  );
  check(sampled.result.case === "sample", "sample result");
  const seqs = sampled.result.value.sequences;
  check(seqs.length === 2, `2 sequences, got ${seqs.length}`);
  for (const s of seqs) {
    check(s.tokens.length >= 1 && s.tokens.length <= 5, `1..5 tokens, got ${s.tokens.length}`);
    check(s.logprobs.length === s.tokens.length, "one logprob per token");
    check(s.tokens.every((t) => t >= 0 && t < 512), "token ids in the vocabulary");
    console.log(`sample: tokens [${s.tokens.join(", ")}]`);
  }
  // A missing run is NotFound: Connect error codes map.
  const missing = await training.getTrainingRun({ id: "run-nope" }).then(
    () => undefined,
    (err: unknown) => ConnectError.from(err),
  );
  check(missing?.code === Code.NotFound, `NotFound expected, got ${missing?.code}`);
  console.log(`ts client: OK (losses ${losses.map((l) => l.toFixed(4)).join(", ")}; ${Math.round(performance.now() - t0)} ms)`);
}

main().catch((err: unknown) => {
  console.error("ts client: FAILED:", err);
  process.exit(1);
});
