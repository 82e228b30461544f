"""Multi-turn tool-calling episodes through the real tinker SDK (bench/prefix).

`TestPrefixCacheSDK` (sdk_test.go) runs this against a gateway with the prefix cache and one
without; by hand::

    VENV=$(scripts/pyenv.sh tinker-0.38.0 tinker==0.38.0 pytest pytest-timeout numpy transformers)
    TINKER_BASE_URL=http://127.0.0.1:8000 TINKER_API_KEY=tml-bench TINKER_TELEMETRY=0 \\
        $VENV/bin/python bench/prefix/sdk_episode.py

Each episode starts from a shared system prompt (`--system` tokens) and its own task
(`--task` tokens); each turn samples (`--max-tokens`, temperature 0.7, seeded) and the next
turn's prompt is this prompt + the completion + a tool result (`--tool` tokens), as the
cookbook's tool_calling and sandboxed_agent recipes build theirs. It prints one line of
JSON: the prompt tokens sent and each sample's latency in milliseconds (``sample(...)
.result()``, each waited for before the next).
"""

import argparse
import json
import time

import tinker
from tinker import types


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--episodes", type=int, default=4)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--system", type=int, default=400)
    ap.add_argument("--task", type=int, default=40)
    ap.add_argument("--tool", type=int, default=60)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--base-model", default="loops/tiny")
    args = ap.parse_args()

    sampler = tinker.ServiceClient().create_sampling_client(base_model=args.base_model)
    system = [(i * 37 + 11) % 509 for i in range(args.system)]
    lat, prompt_tokens = [], 0
    for ep in range(args.episodes):
        prompt = system + [(ep * 101 + i * 13) % 509 for i in range(args.task)]
        for turn in range(args.turns):
            params = types.SamplingParams(max_tokens=args.max_tokens, temperature=0.7, seed=ep * 100 + turn)
            t0 = time.perf_counter()
            resp = sampler.sample(prompt=types.ModelInput.from_ints(prompt), num_samples=1,
                                  sampling_params=params).result(timeout=300)
            lat.append((time.perf_counter() - t0) * 1e3)
            prompt_tokens += len(prompt)
            tool = [(ep * 31 + turn * 17 + i * 7) % 509 for i in range(args.tool)]
            prompt = prompt + list(resp.sequences[0].tokens) + tool
    print(json.dumps({"samples": len(lat), "prompt_tokens": prompt_tokens,
                      "mean_ms": sum(lat) / len(lat), "ms": lat}))


if __name__ == "__main__":
    main()
