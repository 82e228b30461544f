"""Structured outputs through the official `openai` client on a deployed checkpoint:
response_format json_schema (strict) and json_object, streamed and not.

    LOOPS_URL=http://127.0.0.1:PORT LOOPS_API_KEY=tml-anything python structured.py

The script saves a LoRA checkpoint of loops/tiny through the tinker SDK (save_weights_for_sampler,
untrained: the point is the sampler's constraint, not what the model learned) and samples it
through /oai/api/v1 at temperature 1 with several seeds, plain and streamed: every answer that
completes (finish_reason "stop") parses and validates (the `jsonschema` package) against a
strict schema with an enum, an integer, a nested object and an array, or is a JSON object for
json_object, and the schema's integers have at most 15 digits (docs/openai.md: they fit an
int64 on every engine); answers cut by max_tokens (finish_reason "length") are counted and
reported; at least one of each kind must complete. A streamed answer is the plain answer of the same seed.
Then logit_bias, presence_penalty, frequency_penalty and min_p (extra_body) are accepted with a
schema. Runs against any engine (make test-clients runs it on the reference engine and the
torch worker). Exits 1 on any failure.
"""

from __future__ import annotations

import json
import os
import sys
import time

import jsonschema
import openai
import tinker

URL = os.environ["LOOPS_URL"].rstrip("/")
KEY = os.environ.get("LOOPS_API_KEY", "tml-clients-test")
BASE = "loops/tiny"
SEEDS = range(int(os.environ.get("LOOPS_STRUCTURED_SEEDS", "4")))
MAX_TOKENS = 160
MSGS = [{"role": "user", "content": "Describe a city as JSON."}]
SCHEMA = {
    "type": "object",
    "properties": {
        "kind": {"type": "string", "enum": ["town", "city", "village"]},
        "population": {"type": "integer"},
        "location": {
            "type": "object",
            "properties": {"north": {"type": "boolean"}, "zone": {"type": "integer"}},
            "required": ["north", "zone"],
            "additionalProperties": False,
        },
        "tags": {"type": "array", "items": {"type": "string", "enum": ["old", "new", "big"]}, "maxItems": 3},
    },
    "required": ["kind", "population", "location", "tags"],
    "additionalProperties": False,
}
FORMATS = {
    "json_schema": {"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA, "strict": True}},
    "json_object": {"type": "json_object"},
}


def check(cond: bool, what: str) -> None:
    if not cond:
        print(f"FAIL: {what}", file=sys.stderr)
        sys.exit(1)
    print(f"ok: {what}")


def validate(kind: str, text: str) -> None:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        check(False, f"{kind}: a completed answer parses as JSON ({e}): {text!r}")
    if kind == "json_schema":
        try:
            jsonschema.validate(value, SCHEMA)
        except jsonschema.ValidationError as e:
            check(False, f"{kind}: a completed answer validates ({e.message}): {text!r}")
        ints = [value["population"], value["location"]["zone"]]
        check(all(abs(n) < 10**15 for n in ints), f"{kind}: its integers have at most 15 digits (docs/openai.md): {ints}")
        print(f"ok: {kind}: a completed answer validates: {text}")
    else:
        check(isinstance(value, dict), f"{kind}: a completed answer is an object: {text!r}")


def streamed(client: openai.OpenAI, **kw) -> tuple[str, str | None]:
    text, finish = "", None
    for chunk in client.chat.completions.create(stream=True, **kw):
        for ch in chunk.choices:
            text += ch.delta.content or ""
            finish = ch.finish_reason or finish
    return text, finish


def main() -> None:
    client = openai.OpenAI(base_url=URL + "/oai/api/v1", api_key=KEY, max_retries=0)
    t0 = time.time()
    service = tinker.ServiceClient(base_url=URL, api_key=KEY)
    tc = service.create_lora_training_client(base_model=BASE, rank=8, seed=5).result(timeout=120)
    path = tc.save_weights_for_sampler("structured").result(timeout=120).path
    print(f"checkpoint {path} ({time.time() - t0:.1f}s)", flush=True)

    for kind, fmt in FORMATS.items():
        done = cut = 0
        for seed in SEEDS:
            kw = dict(model=path, messages=MSGS, response_format=fmt, temperature=1, seed=seed, max_tokens=MAX_TOKENS)
            r = client.chat.completions.create(**kw)
            c = r.choices[0]
            text, finish = c.message.content or "", c.finish_reason
            check(finish in ("stop", "length"), f"{kind} seed {seed}: finish_reason {finish}")
            if finish == "stop":
                validate(kind, text)
                done += 1
            else:
                cut += 1
                print(f"{kind} seed {seed}: finish_reason length after {r.usage.completion_tokens} tokens: {text[:80]!r}…")
            s_text, s_finish = streamed(client, **kw)
            check((s_text, s_finish) == (text, finish), f"{kind} seed {seed}: the streamed answer is the plain one ({finish})")
        print(f"{kind}: {done} of {done + cut} answers completed within {MAX_TOKENS} tokens, {cut} cut (finish_reason length)")
        check(done >= 1, f"{kind}: at least one answer completed, and every completed one validates")

    # The sampling adjustments go through the client with a schema (min_p is vLLM's extension,
    # sent in the body as extra_body).
    kw = dict(model=path, messages=MSGS, response_format=FORMATS["json_schema"], temperature=1, seed=1, max_tokens=MAX_TOKENS,
              logit_bias={"0": -100, "1": 5}, presence_penalty=0.5, frequency_penalty=0.3, extra_body={"min_p": 0.05})
    r = client.chat.completions.create(**kw)
    c = r.choices[0]
    check(c.finish_reason in ("stop", "length"), f"logit_bias, presence/frequency_penalty and min_p accepted ({c.finish_reason})")
    if c.finish_reason == "stop":
        validate("json_schema", c.message.content)
    s_text, s_finish = streamed(client, **kw)
    check((s_text, s_finish) == (c.message.content or "", c.finish_reason), "streamed with them too")
    print(f"structured outputs: all checks passed ({time.time() - t0:.0f}s)")


if __name__ == "__main__":
    main()
