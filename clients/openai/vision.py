"""Images through the official `openai` and `anthropic` clients on a tiny Qwen3-VL served by
`loops serve --backend torch --model DIR` (DIR written by vl_model.py): the answer to a chat
message holding an image is the answer to the same prompt sent as Tinker image chunks.

    LOOPS_URL=http://127.0.0.1:PORT LOOPS_API_KEY=tml-anything python vision.py DIR

- OpenAI: a user message of text, an image_url part with a data:image/png;base64 URL, and
  text, sampled with seed 7 at temperature 1 with logprobs, is token for token (and log-prob
  for log-prob) the tinker SDK's sample of the prompt that transformers' apply_chat_template
  renders for the same message, with its image placeholder sent as an ImageChunk (seed 7);
  its usage counts the image's 6 tokens;
- Anthropic: the same message as text and a base64 image block, greedy, is the SDK's greedy
  sample;
- an http(s) image URL is a 400 saying Loops fetches no URLs, an Anthropic url source too,
  a JPEG data URL holding a PNG is a 400 saying which format the bytes are;
- a deployed VL checkpoint: one SFT step with an image chunk (tinker SDK), the sampler
  weights saved and deployed with `loops deploy create` (LOOPS_BIN, the loops binary), then
  GET /models lists the deployment with its catalog fields (modalities text and image,
  sampleable, not trainable) and the openai client's image_url message to the deployment is,
  seeded, token for token the tinker SDK's sample of the checkpoint with the image chunk.

Exits 1 on any failure.
"""

from __future__ import annotations

import base64
import os
import struct
import subprocess
import sys
import zlib

import anthropic
import openai
import tinker
from tinker import types
from transformers import AutoTokenizer

URL = os.environ["LOOPS_URL"].rstrip("/")
KEY = os.environ.get("LOOPS_API_KEY", "tml-clients-test")
TOKENS = 6  # a 24×16 image: 6×4 patches of 4 pixels, merged 2×2


def check(cond: bool, what: str) -> None:
    if not cond:
        print(f"FAIL: {what}", file=sys.stderr)
        sys.exit(1)
    print(f"ok: {what}")


def png(w: int = 24, h: int = 16) -> bytes:
    """A w×h RGB PNG of varied pixels (the standard library's zlib: no Pillow here)."""
    rows = b"".join(b"\x00" + bytes((x * 37 + y * 101 + c * 59) % 256 for x in range(w) for c in range(3)) for y in range(h))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def chunks(tok, pic: bytes) -> types.ModelInput:
    """The prompt as transformers renders the message, its image placeholder an ImageChunk."""
    msgs = [{"role": "user", "content": [{"type": "text", "text": "What is"}, {"type": "image"}, {"type": "text", "text": "this?"}]}]
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    pre, post = text.split("<|image_pad|>")
    return types.ModelInput(chunks=[
        types.EncodedTextChunk(tokens=tok.encode(pre, add_special_tokens=False)),
        types.ImageChunk(data=pic, format="png", expected_tokens=TOKENS),
        types.EncodedTextChunk(tokens=tok.encode(post, add_special_tokens=False))])


def main(model: str) -> None:
    tok = AutoTokenizer.from_pretrained(model)
    pic = png()
    b64 = base64.b64encode(pic).decode()
    service = tinker.ServiceClient(base_url=URL, api_key=KEY)
    sc = service.create_sampling_client(base_model=model).result(timeout=120)
    prompt = chunks(tok, pic)
    oai = openai.OpenAI(base_url=URL + "/oai/api/v1", api_key=KEY, max_retries=0)
    parts = [{"type": "text", "text": "What is"}, {"type": "image_url", "image_url": {"url": "data:image/png;base64," + b64}},
             {"type": "text", "text": "this?"}]

    # OpenAI, seeded at temperature 1: the SDK's seeded sample of the same prompt.
    got = oai.chat.completions.create(model=model, messages=[{"role": "user", "content": parts}], max_tokens=8,
                                      temperature=1.0, seed=7, logprobs=True)
    want = sc.sample(prompt, num_samples=1, sampling_params=types.SamplingParams(max_tokens=8, temperature=1.0, seed=7)).result(timeout=300)
    seq = want.sequences[0]
    lps = [c.logprob for c in got.choices[0].logprobs.content]
    n = len(lps)
    check(n > 0 and [c.token for c in got.choices[0].logprobs.content] == [tok.decode([t]) for t in seq.tokens[:n]],
          f"openai image_url: the tokens are the SDK's image-chunk sample ({n} tokens)")
    check(max(abs(a - b) for a, b in zip(lps, seq.logprobs[:n])) < 1e-5,
          f"openai image_url: the log-probs are the SDK's (max |Δ| {max(abs(a - b) for a, b in zip(lps, seq.logprobs[:n])):.2e})")
    check(got.choices[0].message.content == tok.decode(seq.tokens[:n], skip_special_tokens=True),
          f"openai image_url: the text is the SDK sample's, {got.choices[0].message.content!r}")
    check(got.usage.prompt_tokens == prompt.length, f"openai usage counts the image's tokens: {got.usage.prompt_tokens} = {prompt.length}")

    # Anthropic, greedy: the SDK's greedy sample.
    ant = anthropic.Anthropic(base_url=URL + "/anthropic/api", api_key=KEY, max_retries=0)
    blocks = [{"type": "text", "text": "What is"}, {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64}},
              {"type": "text", "text": "this?"}]
    msg = ant.messages.create(model=model, max_tokens=8, messages=[{"role": "user", "content": blocks}],
                              extra_body={"temperature": 0.0})
    greedy = sc.sample(prompt, num_samples=1, sampling_params=types.SamplingParams(max_tokens=8, temperature=0.0)).result(timeout=300)
    text = "".join(b.text for b in msg.content if b.type == "text")
    k = msg.usage.output_tokens
    check(text == tok.decode(greedy.sequences[0].tokens[:k], skip_special_tokens=True),
          f"anthropic image block: the greedy answer is the SDK's greedy image-chunk sample, {text!r}")
    check(msg.usage.input_tokens == prompt.length, f"anthropic usage counts the image's tokens: {msg.usage.input_tokens}")

    # Refusals, each a 400 that says what to send.
    for url, says in (("https://example.com/cat.png", "Loops fetches no URLs"),
                      ("data:image/jpeg;base64," + b64, "its bytes are png")):
        try:
            oai.chat.completions.create(model=model, max_tokens=2, messages=[
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}])
            check(False, f"{url[:30]} is refused")
        except openai.BadRequestError as e:
            check(says in str(e), f"openai {url[:24]}…: 400 {says!r}")
    try:
        ant.messages.create(model=model, max_tokens=2, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.png"}}]}])
        check(False, "an anthropic url source is refused")
    except anthropic.BadRequestError as e:
        check("Loops fetches no URLs" in str(e), "anthropic url source: 400 'Loops fetches no URLs'")

    deployed(service, oai, model, tok, prompt, parts, want.sequences[0])


def deployed(service, oai, model: str, tok, prompt: types.ModelInput, parts: list, base) -> None:
    """One SFT step with an image chunk, its sampler weights deployed by `loops deploy
    create`, then an image sent to the deployment by the openai client."""
    answer = tok.encode(" a picture of stripes", add_special_tokens=False)
    n = prompt.length + len(answer) - 1
    datum = types.Datum(
        model_input=types.ModelInput(chunks=[*prompt.chunks, types.EncodedTextChunk(tokens=answer[:-1])]),
        loss_fn_inputs={"target_tokens": types.TensorData(data=[0] * (prompt.length - 1) + answer, dtype="int64", shape=[n]),
                        "weights": types.TensorData(data=[0.0] * (prompt.length - 1) + [1.0] * len(answer), dtype="float32", shape=[n])})
    assert datum.model_input.length == n
    tc = service.create_lora_training_client(base_model=model, rank=4).result(timeout=300)
    fb = tc.forward_backward([datum], "cross_entropy").result(timeout=300)
    tc.optim_step(types.AdamParams(learning_rate=1e-2)).result(timeout=300)
    check(fb.loss_fn_outputs is not None, "a training step with an image chunk on the VL model")
    path = tc.save_weights_for_sampler(name="vl-step1").result(timeout=300).path
    out = subprocess.run([os.environ["LOOPS_BIN"], "deploy", "create", "--name", "vl-demo", "--checkpoint", path],
                         env={**os.environ, "LOOPS_URL": URL, "LOOPS_API_KEY": KEY}, capture_output=True, text=True, timeout=300)
    check(out.returncode == 0, f"loops deploy create --checkpoint {path}: {out.stdout.strip()} {out.stderr.strip()}")

    listed = {m.id: m for m in oai.models.list().data}
    check("vl-demo" in listed, f"GET /models lists the deployment: {sorted(listed)}")
    dep, bm = listed["vl-demo"], listed[model]
    check(bm.modalities == ["text", "image"] and bm.trainable and bm.sampleable and bm.backend == "torch"
          and "serverless" in bm.availability and bm.family == "qwen3_vl",
          f"the base model's catalog fields: {bm.model_extra}")
    check(dep.base_model == model and dep.modalities == ["text", "image"] and dep.sampleable and not dep.trainable,
          f"the deployment's catalog fields: {dep.model_extra}")

    got = oai.chat.completions.create(model="vl-demo", messages=[{"role": "user", "content": parts}], max_tokens=8,
                                      temperature=1.0, seed=7, logprobs=True)
    sc = service.create_sampling_client(model_path=path).result(timeout=300)
    seq = sc.sample(prompt, num_samples=1, sampling_params=types.SamplingParams(max_tokens=8, temperature=1.0, seed=7)).result(timeout=300).sequences[0]
    lps = [c.logprob for c in got.choices[0].logprobs.content]
    n = len(lps)
    check(n > 0 and [c.token for c in got.choices[0].logprobs.content] == [tok.decode([t]) for t in seq.tokens[:n]],
          f"deployed VL checkpoint, openai image_url: the tokens are the SDK's image-chunk sample of the checkpoint ({n} tokens)")
    d = max(abs(a - b) for a, b in zip(lps, seq.logprobs[:n]))
    check(d < 1e-5, f"deployed VL checkpoint: the log-probs are the SDK's (max |Δ| {d:.2e})")
    if seq.tokens[0] == base.tokens[0]:
        check(abs(seq.logprobs[0] - base.logprobs[0]) > 1e-6,
              f"the trained step changed the answer's log-prob ({base.logprobs[0]:.6f} → {seq.logprobs[0]:.6f}): the adapter is applied")


if __name__ == "__main__":
    main(sys.argv[1])
