"""echo with logprobs on POST /completions through the official `openai` client, on a checkpoint
that the tinker SDK trained and saved: the prompt's own log-probs.

    LOOPS_URL=http://127.0.0.1:PORT LOOPS_API_KEY=tml-anything python echo.py

- echo, logprobs 5, max_tokens 1 (what lm-evaluation-harness sends for its loglikelihood
  requests), prompt as token ids: the logprobs cover the prompt's tokens (first null) and the
  sampled one; the prompt's log-probs are tinker's compute_logprobs of the same tokens on the
  same checkpoint (within 1e-5), and each position's top_logprobs are the alternatives of a
  token sampled greedily after that prefix (a separate request: the decoding path) within 1e-4;
- max_tokens 0 scores the prompt alone; a batch of prompts echoes each;
- no legacy top_logprobs object repeats a key (a long sample at temperature 1).

Runs against any engine (make test-clients runs it on the reference engine and the torch
worker). Exits 1 on any failure.
"""

from __future__ import annotations

import json
import os
import sys

import openai
import tinker
from tinker import types

URL = os.environ["LOOPS_URL"].rstrip("/")
KEY = os.environ.get("LOOPS_API_KEY", "tml-clients-test")


def check(cond: bool, what: str) -> None:
    if not cond:
        print(f"FAIL: {what}", file=sys.stderr)
        sys.exit(1)
    print(f"ok: {what}")


def no_duplicates(pairs):
    keys = [k for k, _ in pairs]
    if len(keys) != len(set(keys)):
        check(False, f"a JSON object repeats no key: {keys}")
    return dict(pairs)


def main() -> None:
    service = tinker.ServiceClient(base_url=URL, api_key=KEY)
    tc = service.create_lora_training_client(base_model="loops/tiny", rank=8, seed=11).result(timeout=120)
    tok = tc.get_tokenizer()
    ids = tok.encode("The cat sat on the mat and looked at the moon.")
    datum = types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]),
                        loss_fn_inputs={"target_tokens": ids[1:], "weights": [1.0] * (len(ids) - 1)})
    for _ in range(2):
        tc.forward_backward([datum], "cross_entropy").result(timeout=120)
        tc.optim_step(types.AdamParams(learning_rate=1e-2)).result(timeout=120)
    path = tc.save_weights_for_sampler("echo").result(timeout=120).path
    sc = service.create_sampling_client(model_path=path).result(timeout=120)
    client = openai.OpenAI(base_url=URL + "/oai/api/v1", api_key=KEY, max_retries=0)

    prompt = tok.encode("hello world, the cat sat")
    n = len(prompt)
    want = sc.compute_logprobs(types.ModelInput.from_ints(prompt)).result(timeout=120)
    r = client.completions.create(model=path, prompt=prompt, echo=True, logprobs=5, max_tokens=1, temperature=0)
    lp = r.choices[0].logprobs
    check(len(lp.tokens) == n + 1 and len(lp.token_logprobs) == n + 1 and len(lp.top_logprobs) == n + 1,
          f"echo: logprobs for the {n} prompt tokens and the sampled one")
    check(lp.token_logprobs[0] is None and lp.top_logprobs[0] is None, "the first prompt token's logprob is null")
    worst = max(abs(lp.token_logprobs[i] - want[i]) for i in range(1, n))
    check(worst <= 1e-5, f"the prompt's log-probs are compute_logprobs' (max_abs_diff {worst:.3g})")
    check(r.choices[0].text.startswith(tok.decode(prompt)), "the text starts with the prompt")
    for i in range(1, n):
        nxt = client.completions.create(model=path, prompt=prompt[:i], logprobs=5, max_tokens=1, temperature=0)
        alts = nxt.choices[0].logprobs.top_logprobs[0]
        got = lp.top_logprobs[i]
        check(set(got) == set(alts) and all(abs(got[k] - v) <= 1e-4 for k, v in alts.items()),
              f"position {i}: the prompt's alternatives are those sampled after its prefix")
    last = client.completions.create(model=path, prompt=prompt, logprobs=0, max_tokens=1, temperature=0).choices[0].logprobs
    check(last.tokens[0] == lp.tokens[n] and abs(last.token_logprobs[0] - lp.token_logprobs[n]) <= 1e-4,
          "the sampled token after the echoed prompt is a plain request's")

    zero = client.completions.create(model=path, prompt=[prompt, prompt[:3]], echo=True, logprobs=1, max_tokens=0)
    check([c.text for c in zero.choices] == [tok.decode(prompt), tok.decode(prompt[:3])] and zero.usage.completion_tokens == 0,
          "max_tokens 0: each prompt alone, nothing sampled")
    check(len(zero.choices[1].logprobs.tokens) == 3, "batched prompts: each choice echoes its own")

    raw = client.completions.with_raw_response.create(model=path, prompt="é ü — ", logprobs=5, max_tokens=64, temperature=1, seed=3)
    body = json.loads(raw.http_response.text, object_pairs_hook=no_duplicates)
    check(len(body["choices"][0]["logprobs"]["top_logprobs"]) > 0, "a long sample's top_logprobs repeat no key")


if __name__ == "__main__":
    main()
