"""POST /oai/api/v1/embeddings of a Loops server, driven by the official `openai` client.

    LOOPS_URL=http://127.0.0.1:PORT LOOPS_API_KEY=tml-anything python embeddings.py

Checks: a string, a list of strings, a token array and a list of token arrays embed to
vectors of loops/tiny's hidden size (256), the same input giving the same vector alone or in a
list; the client's default encoding (base64, which it decodes) equals encoding_format float;
usage counts the inputs' tokens; dimensions other than the hidden size, an empty input and
too many inputs are OpenAI-shaped 400s naming the field. Exits 1 on any failure.
"""

from __future__ import annotations

import os
import sys
from array import array

import openai

URL = os.environ["LOOPS_URL"].rstrip("/")
KEY = os.environ.get("LOOPS_API_KEY", "tml-clients-test")
BASE = "loops/tiny"
HIDDEN = 256


def check(cond: bool, what: str) -> None:
    if not cond:
        print(f"FAIL: {what}", file=sys.stderr)
        sys.exit(1)
    print(f"ok: {what}")


def f32(v: list[float]) -> array:
    return array("f", v)


def expect_bad_request(param: str, fn) -> None:
    try:
        fn()
    except openai.BadRequestError as e:
        body = e.body if isinstance(e.body, dict) else {}
        check(body.get("param") == param and bool(body.get("message")), f"400 names {param!r}: {body.get('message')}")
        return
    check(False, f"expected a 400 naming {param!r}")


def main() -> None:
    client = openai.OpenAI(base_url=URL + "/oai/api/v1", api_key=KEY, max_retries=0)

    texts = ["The capital of France is Paris.", "def add(a, b): return a + b"]
    r = client.embeddings.create(model=BASE, input=texts)  # the client asks for base64 and decodes it
    check(r.object == "list" and r.model == BASE and len(r.data) == 2, "list shape")
    check([d.index for d in r.data] == [0, 1] and all(d.object == "embedding" for d in r.data), "items in order")
    check(all(len(d.embedding) == HIDDEN for d in r.data), f"vectors of the hidden size {HIDDEN}")
    check(r.data[0].embedding != r.data[1].embedding, "different texts, different vectors")
    check(r.usage.prompt_tokens > 0 and r.usage.total_tokens == r.usage.prompt_tokens, f"usage {r.usage}")

    f = client.embeddings.create(model=BASE, input=texts, encoding_format="float")
    # JSON floats are float32 values in their shortest decimal form: equal once read as float32
    check([f32(d.embedding) for d in f.data] == [f32(d.embedding) for d in r.data], "float equals the decoded base64")
    one = client.embeddings.create(model=BASE, input=texts[0], encoding_format="float", dimensions=HIDDEN)
    check(one.data[0].embedding == f.data[0].embedding, "a string alone equals it in a list")

    toks = client.embeddings.create(model=BASE, input=[[3, 14, 15, 92], [65]])
    check(len(toks.data) == 2 and toks.usage.prompt_tokens == 5, "a list of token arrays (5 tokens)")
    single = client.embeddings.create(model=BASE, input=[3, 14, 15, 92])
    check(single.data[0].embedding == toks.data[0].embedding, "a token array alone equals it in a list")

    expect_bad_request("dimensions", lambda: client.embeddings.create(model=BASE, input="x", dimensions=8))
    expect_bad_request("input", lambda: client.embeddings.create(model=BASE, input=""))
    expect_bad_request("input", lambda: client.embeddings.create(model=BASE, input=["x"] * 129))
    try:
        client.embeddings.create(model="no/such-model", input="x")
        check(False, "an unknown model is refused")
    except openai.NotFoundError:
        check(True, "an unknown model is a 404")
    print("openai client embeddings: all checks passed")


if __name__ == "__main__":
    main()
