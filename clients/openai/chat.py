"""The OpenAI-compatible API of a Loops server, driven by the official `openai` client, and a
checkpoint saved by a tinker training script served through it at once.

    LOOPS_URL=http://127.0.0.1:PORT LOOPS_API_KEY=tml-anything python chat.py

Checks: GET /models lists loops/tiny; chat completions (n, seed, logprobs and top_logprobs, usage,
finish_reason); streaming with stream_options.include_usage equals the plain answer;
completions; OpenAI-shaped 400s naming unsupported fields; then a tinker SDK LoRA step,
save_weights_for_sampler, and chat/completions on the saved path (alone and as
"<base>;<path>"), whose greedy completion has the logprobs of the tinker SamplingClient's
greedy sample of the same prompt tokens; another API key gets a 404 for that path. Exits 1
on any failure.
"""

from __future__ import annotations

import math
import os
import sys

import openai
import tinker
from tinker import types

URL = os.environ["LOOPS_URL"].rstrip("/")
KEY = os.environ.get("LOOPS_API_KEY", "tml-clients-test")
BASE = "loops/tiny"
MSGS = [
    {"role": "system", "content": "You are brief."},
    {"role": "user", "content": "What is the capital of France?"},
]


def check(cond: bool, what: str) -> None:
    if not cond:
        print(f"FAIL: {what}", file=sys.stderr)
        sys.exit(1)
    print(f"ok: {what}")


def expect_error(kind: type[openai.APIStatusError], param: str | None, fn) -> None:
    try:
        fn()
    except kind as e:
        body = e.body if isinstance(e.body, dict) else {}
        check(param is None or body.get("param") == param, f"{kind.__name__} names param {param!r}: {body}")
        check(bool(body.get("message")) and bool(body.get("type")), "error has message and type")
        return
    check(False, f"expected {kind.__name__}")


def main() -> None:
    client = openai.OpenAI(base_url=URL + "/oai/api/v1", api_key=KEY, max_retries=0)

    ids = [m.id for m in client.models.list()]
    check(BASE in ids, f"models lists {BASE}: {ids}")

    chat = client.chat.completions.create(model=BASE, messages=MSGS, max_tokens=8, temperature=0)
    c = chat.choices[0]
    check(chat.object == "chat.completion" and c.message.role == "assistant", "chat completion shape")
    check(isinstance(c.message.content, str) and c.finish_reason in ("stop", "length"), f"content {c.message.content!r}, {c.finish_reason}")
    u = chat.usage
    check(u is not None and u.prompt_tokens > 0 and u.total_tokens == u.prompt_tokens + u.completion_tokens, f"usage {u}")

    a = client.chat.completions.create(model=BASE, messages=MSGS, max_tokens=8, n=2, seed=11, logprobs=True)
    b = client.chat.completions.create(model=BASE, messages=MSGS, max_tokens=8, n=2, seed=11, logprobs=True)
    check(len(a.choices) == 2, "n=2 gives two choices")
    check([x.message.content for x in a.choices] == [x.message.content for x in b.choices], "same seed, same choices")
    lp = a.choices[0].logprobs
    check(lp is not None and lp.content and all(math.isfinite(t.logprob) and t.logprob <= 0 for t in lp.content), "per-token logprobs")

    text, finish, usage = "", None, None
    for chunk in client.chat.completions.create(
        model=BASE, messages=MSGS, max_tokens=8, temperature=0, stream=True, stream_options={"include_usage": True}
    ):
        for ch in chunk.choices:
            text += ch.delta.content or ""
            finish = ch.finish_reason or finish
        usage = chunk.usage or usage
    check(text == c.message.content and finish == c.finish_reason, f"stream equals the plain answer: {text!r}")
    check(usage is not None and usage.total_tokens == u.total_tokens, f"stream usage {usage}")

    cmpl = client.completions.create(model=BASE, prompt="The quick brown fox", max_tokens=6, temperature=0, logprobs=0)
    check(cmpl.choices[0].finish_reason in ("stop", "length") and cmpl.usage.completion_tokens > 0, f"completion {cmpl.choices[0].text!r}")

    expect_error(openai.BadRequestError, "reasoning_effort", lambda: client.chat.completions.create(
        model=BASE, messages=MSGS, reasoning_effort="high"))
    expect_error(openai.NotFoundError, "model", lambda: client.chat.completions.create(model="no/such-model", messages=MSGS))
    neutral = client.chat.completions.create(
        model=BASE, messages=[{"role": "developer", "content": "Be brief."}, *MSGS[1:]], max_tokens=2, response_format={"type": "text"},
        store=False, service_tier="auto", user="u1", metadata={"k": "v"}, parallel_tool_calls=True,
        tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}], tool_choice="none")
    check(neutral.choices[0].message.tool_calls is None, "neutral values and the developer role are accepted")
    expect_error(openai.BadRequestError, "top_logprobs", lambda: client.chat.completions.create(
        model=BASE, messages=MSGS, logprobs=True, top_logprobs=21))
    top = client.chat.completions.create(model=BASE, messages=MSGS, max_tokens=4, temperature=0, logprobs=True, top_logprobs=3)
    tl = top.choices[0].logprobs.content
    check(all(len(t.top_logprobs) == 3 and t.top_logprobs[0].token == t.token and t.top_logprobs[0].logprob == t.logprob for t in tl),
          "top_logprobs: 3 alternatives per token, the greedy token first")
    streamed = [t for chunk in client.chat.completions.create(model=BASE, messages=MSGS, max_tokens=4, temperature=0, logprobs=True,
                                                              top_logprobs=3, stream=True)
                for ch in chunk.choices if ch.logprobs for t in ch.logprobs.content]
    check([t.model_dump() for t in streamed] == [t.model_dump() for t in tl], "streamed top_logprobs equal the plain ones")
    expect_error(openai.BadRequestError, "n", lambda: client.chat.completions.create(model=BASE, messages=MSGS, n=0))
    expect_error(openai.BadRequestError, "messages[0].tool_call_id", lambda: client.chat.completions.create(
        model=BASE, messages=[{"role": "tool", "content": "x", "tool_call_id": "1"}]))

    # A checkpoint saved by a tinker training script is servable at once.
    service = tinker.ServiceClient(base_url=URL, api_key=KEY)
    tc = service.create_lora_training_client(base_model=BASE, rank=4, seed=1).result(timeout=120)
    toks = [65 + i % 20 for i in range(17)]
    datum = types.Datum(model_input=types.ModelInput.from_ints(toks[:-1]),
                        loss_fn_inputs={"target_tokens": toks[1:], "weights": [1.0] * 16})
    fb = tc.forward_backward([datum], "cross_entropy")
    opt = tc.optim_step(types.AdamParams(learning_rate=1e-2))
    fb.result(timeout=120)
    opt.result(timeout=120)
    path = tc.save_weights_for_sampler("openai-e2e").result(timeout=120).path
    check(path.startswith("tinker://") and "/sampler_weights/" in path, f"saved {path}")
    for model in (path, f"{BASE};{path}"):
        r = client.chat.completions.create(model=model, messages=MSGS, max_tokens=4)
        check(r.model == model and r.choices[0].finish_reason in ("stop", "length"), f"chat on {model}")
    check(client.models.retrieve(path).id == path, "models.retrieve(path)")
    check(path in [m.id for m in client.models.list()], "models lists the checkpoint")

    prompt = toks[:6]
    sc = service.create_sampling_client(model_path=path).result(timeout=120)
    want = sc.sample(types.ModelInput.from_ints(prompt), 1, types.SamplingParams(max_tokens=8, temperature=0.0)).result(timeout=120).sequences[0]
    got = client.completions.create(model=path, prompt=prompt, max_tokens=8, temperature=0, logprobs=0)
    check(got.usage.completion_tokens == len(want.tokens), f"greedy length {got.usage.completion_tokens} == {len(want.tokens)}")
    glp = got.choices[0].logprobs.token_logprobs
    check(all(math.isclose(x, y, rel_tol=1e-5, abs_tol=1e-5) for x, y in zip(glp, want.logprobs, strict=True)),
          "greedy completion has the tinker sample's logprobs")

    other = openai.OpenAI(base_url=URL + "/oai/api/v1", api_key="tml-another-workspace", max_retries=0)
    expect_error(openai.NotFoundError, None, lambda: other.chat.completions.create(model=path, messages=MSGS))
    print("openai client: all checks passed")


if __name__ == "__main__":
    main()
