"""Transformers' answers to lm-eval's requests, on a Hugging Face model folder (the merged
export of a checkpoint), for lmeval_check.py.

    python reference.py SPEC.json   # prints {"mc": [[sum, ...], ...], "gen": [...], "chat": [...]}

SPEC: {"model": folder, "mc": [[{"context", "continuation"}, ...] per doc], "gen": [prompt],
"chat": [user message], "max_gen": N, "until": [stop strings]}.

- mc: each continuation's log-likelihood given its context, in float64 from the model's
  float32 logits: the pair is split into tokens as lm-eval's API models do (trailing spaces
  of the context move to the continuation; the context's tokens, then the rest of the whole
  text's tokens), each encoded without special tokens.
- gen: the greedy continuation of each prompt (its tokens, no special tokens), max_gen
  tokens or up to the end of sequence, decoded without special tokens and cut at the first
  stop string.
- chat: the same for each user message rendered with the model's chat template
  (add_generation_prompt).
"""

from __future__ import annotations

import json
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def main() -> None:
    spec = json.load(open(sys.argv[1]))
    tok = AutoTokenizer.from_pretrained(spec["model"])
    model = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=torch.float32).eval()

    def enc(s: str) -> list[int]:
        return tok.encode(s, add_special_tokens=False)

    def logprobs(ids: list[int]) -> torch.Tensor:
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0].double()
        return torch.log_softmax(logits, dim=-1)

    mc = []
    for doc in spec["mc"]:
        sums = []
        for pair in doc:
            ctx, cont = pair["context"], pair["continuation"]
            n = len(ctx) - len(ctx.rstrip())
            if n:
                ctx, cont = ctx[:-n], ctx[-n:] + cont
            whole, c = enc(ctx + cont), enc(ctx)
            cont_ids = whole[len(c):]
            lp = logprobs(whole)
            sums.append(sum(float(lp[len(c) + i - 1, t]) for i, t in enumerate(cont_ids)))
        mc.append(sums)

    eos = set(tok.all_special_ids)

    def greedy(ids: list[int]) -> str:
        out: list[int] = []
        for _ in range(spec["max_gen"]):
            nxt = int(torch.argmax(logprobs(ids + out)[-1]))
            if nxt in eos and nxt == tok.eos_token_id:
                break
            out.append(nxt)
        text = tok.decode(out, skip_special_tokens=True)
        for s in spec["until"]:
            text = text.split(s)[0]
        return text

    gen = [greedy(enc(p)) for p in spec["gen"]]
    chat = []
    for m in spec["chat"]:
        msgs = [{"role": "user", "content": m}]
        ids = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        chat.append(greedy(list(ids)))
    json.dump({"mc": mc, "gen": gen, "chat": chat}, sys.stdout)


if __name__ == "__main__":
    main()
