"""The Anthropic-compatible API of a Loops server, driven by the official `anthropic` client,
and a checkpoint saved by a running tinker training script served through it at once.

    LOOPS_URL=http://127.0.0.1:PORT LOOPS_API_KEY=tml-anything python messages.py

Checks: messages.create (system, multi-turn, text blocks, stop_sequences, usage,
stop_reason); streaming (messages.stream: text deltas add up to the plain answer, final
message's stop_reason and usage) and the raw event types; count_tokens equals the answer's
input_tokens; the same key as a bearer token (auth_token); Anthropic-shaped 400s naming
unsupported fields, a 401 for a key that is not one; then a tinker SDK LoRA run that
saves sampler weights and keeps training while the saved path is served: its greedy answer
is, token for token, the tinker SamplingClient's greedy sample of the chat template's prompt
tokens. Exits 1 on any failure.
"""

from __future__ import annotations

import os
import sys

import anthropic
import tinker
from tinker import types

URL = os.environ["LOOPS_URL"].rstrip("/")
KEY = os.environ.get("LOOPS_API_KEY", "tml-clients-test")
BASE = "loops/tiny"
SYSTEM = "You are brief."
MSGS = [{"role": "user", "content": "What is the capital of France?"}]
# The anthropic client of late 2026 has no temperature, top_p or top_k arguments any more;
# Loops' endpoint takes them (Tinker's does), so they go in the body as extra fields.
GREEDY = {"temperature": 0}


def check(cond: bool, what: str) -> None:
    if not cond:
        print(f"FAIL: {what}", file=sys.stderr)
        sys.exit(1)
    print(f"ok: {what}")


def expect_error(kind: type[anthropic.APIStatusError], mention: str, fn) -> None:
    try:
        fn()
    except kind as e:
        body = e.body if isinstance(e.body, dict) else {}
        err = body.get("error", {}) if isinstance(body.get("error"), dict) else {}
        check(body.get("type") == "error" and bool(err.get("type")), f"{kind.__name__} in Anthropic's shape: {body}")
        check(mention in err.get("message", ""), f"{kind.__name__} names {mention!r}: {err.get('message')}")
        return
    check(False, f"expected {kind.__name__}")


def main() -> None:
    client = anthropic.Anthropic(base_url=URL + "/anthropic/api", api_key=KEY, max_retries=0)

    m = client.messages.create(model=BASE, system=SYSTEM, messages=MSGS, max_tokens=12, extra_body=GREEDY)
    check(m.type == "message" and m.role == "assistant" and m.model == BASE, "message shape")
    check(len(m.content) == 1 and m.content[0].type == "text", f"one text block: {m.content}")
    check(m.stop_reason in ("end_turn", "max_tokens"), f"stop_reason {m.stop_reason}")
    check(m.usage.input_tokens > 0 and 0 < m.usage.output_tokens <= 12, f"usage {m.usage}")
    text = m.content[0].text

    n = client.messages.count_tokens(model=BASE, system=SYSTEM, messages=MSGS)
    check(n.input_tokens == m.usage.input_tokens, f"count_tokens {n.input_tokens} == input_tokens {m.usage.input_tokens}")

    bearer = anthropic.Anthropic(base_url=URL + "/anthropic/api", auth_token=KEY, max_retries=0)
    b = bearer.messages.create(model=BASE, system=SYSTEM, messages=MSGS, max_tokens=12, extra_body=GREEDY)
    check(b.content[0].text == text, "the key as a bearer token, same greedy answer")

    with client.messages.stream(model=BASE, system=SYSTEM, messages=MSGS, max_tokens=12, extra_body=GREEDY) as s:
        streamed = "".join(s.text_stream)
        final = s.get_final_message()
    check(streamed == text, f"streamed text equals the plain answer: {streamed!r}")
    check(final.stop_reason == m.stop_reason and final.usage.output_tokens == m.usage.output_tokens, f"final message {final.stop_reason} {final.usage}")

    kinds = [e.type for e in client.messages.create(model=BASE, system=SYSTEM, messages=MSGS, max_tokens=12, extra_body=GREEDY, stream=True)]
    # (the client does not yield ping events)
    check(kinds[:2] == ["message_start", "content_block_start"] and kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
          and set(kinds[2:-3]) <= {"content_block_delta"}, f"event types {kinds}")

    if len(text) >= 4:
        stop = text[2:4]
        cut = client.messages.create(model=BASE, system=SYSTEM, messages=MSGS, max_tokens=12, extra_body=GREEDY, stop_sequences=[stop])
        check(cut.stop_reason == "stop_sequence" and cut.stop_sequence == stop, f"stopped on {stop!r}: {cut.stop_reason} {cut.stop_sequence!r}")
        check(cut.content[0].text == text[: text.index(stop)], f"text ends before the stop sequence: {cut.content[0].text!r}")

    multi = [
        {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "And again?"},
    ]
    r = client.messages.create(model=BASE, messages=multi, max_tokens=4, extra_body={"temperature": 0.7, "top_p": 0.9, "top_k": 20})
    check(r.usage.output_tokens <= 4, "multi-turn with sampling parameters")

    expect_error(anthropic.BadRequestError, "tools[0].type", lambda: client.messages.create(
        model=BASE, messages=MSGS, max_tokens=4, tools=[{"type": "web_search_20250305", "name": "web_search"}]))
    expect_error(anthropic.NotFoundError, "no/such-model", lambda: client.messages.create(
        model="no/such-model", messages=MSGS, max_tokens=4))
    expect_error(anthropic.BadRequestError, "temperature", lambda: client.messages.create(
        model=BASE, messages=MSGS, max_tokens=4, extra_body={"temperature": 1.5}))
    # an image block whose bytes are not the PNG it says is a 400 naming the block's source
    # (images themselves are taken by vision-language models: clients/openai/vision.py)
    expect_error(anthropic.BadRequestError, "messages[0].content[0].source", lambda: client.messages.create(
        model=BASE, max_tokens=4, messages=[{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}]))
    try:
        anthropic.Anthropic(base_url=URL + "/anthropic/api", api_key="sk-not-a-loops-key", max_retries=0).messages.create(
            model=BASE, messages=MSGS, max_tokens=4)
        check(False, "a key that is not a Loops key is refused")
    except anthropic.AuthenticationError:
        check(True, "a key that is not a Loops key is a 401")

    # A checkpoint saved by a running tinker training script is servable at once, while the
    # script trains on; its greedy answer is the SamplingClient's greedy sample.
    service = tinker.ServiceClient(base_url=URL, api_key=KEY)
    tc = service.create_lora_training_client(base_model=BASE, rank=4, seed=2).result(timeout=120)
    toks = [66 + i % 19 for i in range(17)]
    datum = types.Datum(model_input=types.ModelInput.from_ints(toks[:-1]),
                        loss_fn_inputs={"target_tokens": toks[1:], "weights": [1.0] * 16})
    tc.forward_backward([datum], "cross_entropy").result(timeout=120)
    tc.optim_step(types.AdamParams(learning_rate=2e-2)).result(timeout=120)
    path = tc.save_weights_for_sampler("anthropic-e2e").result(timeout=120).path
    # Training goes on while the checkpoint is served.
    fb = tc.forward_backward([datum], "cross_entropy")
    opt = tc.optim_step(types.AdamParams(learning_rate=2e-2))
    got = client.messages.create(model=path, system=SYSTEM, messages=MSGS, max_tokens=10, extra_body=GREEDY)
    fb.result(timeout=120)
    opt.result(timeout=120)
    check(got.model == path, f"served {path} while training continued")

    tok = tc.get_tokenizer()
    rendered = tok.apply_chat_template([{"role": "system", "content": SYSTEM}, *MSGS], add_generation_prompt=True, tokenize=False)
    prompt = tok.encode(rendered, add_special_tokens=False)
    check(len(prompt) == got.usage.input_tokens, f"prompt tokens {len(prompt)} == input_tokens {got.usage.input_tokens}")
    sc = service.create_sampling_client(model_path=path).result(timeout=120)
    want = sc.sample(types.ModelInput.from_ints(list(prompt)), 1, types.SamplingParams(max_tokens=10, temperature=0.0)).result(timeout=120).sequences[0]
    check(got.usage.output_tokens == len(want.tokens), f"greedy length {got.usage.output_tokens} == {len(want.tokens)}")
    check(got.content[0].text == tok.decode(want.tokens, skip_special_tokens=True),
          f"greedy answer is the SamplingClient's tokens: {got.content[0].text!r}")
    with client.messages.stream(model=path, system=SYSTEM, messages=MSGS, max_tokens=10, extra_body=GREEDY) as s:
        check("".join(s.text_stream) == got.content[0].text, "the checkpoint streams the same answer")
    print("anthropic client: all checks passed")


if __name__ == "__main__":
    main()
