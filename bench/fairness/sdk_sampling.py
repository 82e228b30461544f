"""A light tenant's sampling latency through the real tinker SDK.

`TestSamplingFairnessSDK` (sdk_test.go) runs this against a gateway it serves, alone and
while another workspace floods the sampler; by hand::

    VENV=$(scripts/pyenv.sh tinker-0.38.0 tinker==0.38.0 pytest pytest-timeout numpy transformers)
    TINKER_BASE_URL=http://127.0.0.1:8000 TINKER_API_KEY=tml-light TINKER_TELEMETRY=0 \\
        $VENV/bin/python bench/fairness/sdk_sampling.py --samples 40

It creates a sampling client on the base model, samples a few times to warm up, then times
``sample(...).result()`` of `--samples` requests (a prompt of `--prompt` tokens,
`--max-tokens` generated, temperature 1), each waited for before the next, and prints one
line of JSON: the latencies in milliseconds and their p50 and p99.
"""

import argparse
import json
import time

import tinker
from tinker import types


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=40)
    ap.add_argument("--prompt", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--base-model", default="loops/tiny")
    args = ap.parse_args()

    service = tinker.ServiceClient()
    sampler = service.create_sampling_client(base_model=args.base_model)
    prompt = types.ModelInput.from_ints([65 + i % 26 for i in range(args.prompt)])
    params = types.SamplingParams(max_tokens=args.max_tokens, temperature=1.0)
    lat = []
    for i in range(args.warmup + args.samples):
        t0 = time.perf_counter()
        resp = sampler.sample(prompt=prompt, num_samples=1, sampling_params=params).result(timeout=300)
        took = (time.perf_counter() - t0) * 1e3
        assert len(resp.sequences) == 1 and resp.sequences[0].tokens, resp
        if i >= args.warmup:
            lat.append(took)
    print(json.dumps({"samples": len(lat), "p50_ms": pct(lat, 0.5), "p99_ms": pct(lat, 0.99), "ms": lat}))


if __name__ == "__main__":
    main()
