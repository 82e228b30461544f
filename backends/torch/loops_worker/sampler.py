"""Sampling: request validation (shared by both paths) and the transformers sampler.

The transformers path mirrors the reference engine's nn.Sample: the prompt is run once and
its KV cache repeated per sample; sample i draws from Go's PCG(seed, i + 0x5851f42d4c957f2d);
the distribution is softmax(logits/T) cut to top_k then top_p and renormalised, and the
reported log-prob is the token's log-prob under exactly that distribution (temperature 0:
greedy, log-prob at temperature 1). Stop tokens, the model's EOS ids and stop strings end a
sequence, which includes the stop. Prompt log-probs at temperature 1, first NaN.
"""

from __future__ import annotations

import math
import os
import random
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import List, Optional

import numpy as np
import torch

from . import checkpoint as ckpt
from .errors import invalid
from .pcg import PCG
from .proto import bpb, tpb

MAX_SAMPLES = 256
MAX_TOPK_PROMPT_LOGPROBS = 1024
MAX_TOP_LOGPROBS = 20  # semantics.MaxTopLogprobs
SAMPLER_CACHE_SIZE = 16


@dataclass
class SampleSpec:
    prompt: List[int]
    n: int
    max_tokens: int
    temperature: float
    top_k: int
    top_p: float
    seed: Optional[int]
    stop_tokens: List[int]
    stop_strings: List[str]
    prompt_logprobs: bool
    topk: int
    eos: List[int] = field(default_factory=list)
    top_logprobs: int = 0


def validate(req, bm) -> SampleSpec:
    """reference.Engine.Sample's checks."""
    V = bm.vocab
    if len(req.prompt) == 0:
        raise invalid("the prompt is empty; send at least one token")
    prompt = list(req.prompt)
    for i, t in enumerate(prompt):
        if t < 0 or t >= V:
            raise invalid(f"prompt token {t} at position {i} is outside the vocabulary [0, {V})")
    if req.HasField("params"):
        p = req.params
        max_tokens, temp, top_k, top_p = p.max_tokens, p.temperature, p.top_k, p.top_p
        seed = p.seed if p.HasField("seed") else None
        stop_tokens, stop_strings = list(p.stop_tokens), list(p.stop_strings)
        top_logprobs = p.top_logprobs
    else:
        max_tokens, temp, top_k, top_p, seed, stop_tokens, stop_strings = 16, 1.0, 0, 1.0, None, [], []
        top_logprobs = 0
    n = req.num_samples or 1
    if n < 0 or n > MAX_SAMPLES:
        raise invalid(f"num_samples must be between 1 and {MAX_SAMPLES}, got {n}")
    if max_tokens < 1:
        raise invalid(f"max_tokens must be at least 1, got {max_tokens}")
    if len(prompt) + max_tokens > bm.max_seq:
        raise invalid(
            f"prompt ({len(prompt)} tokens) plus max_tokens ({max_tokens}) exceeds the model's limit of {bm.max_seq} "
            f"tokens; lower max_tokens or shorten the prompt")
    if not (temp >= 0) or math.isinf(temp):
        raise invalid(f"temperature must be >= 0 (0 is greedy), got {temp:g}")
    if not (0 <= top_p <= 1):
        raise invalid(f"top_p must be in (0, 1] (1 means no limit), got {top_p:g}")
    if req.topk_prompt_logprobs < 0 or req.topk_prompt_logprobs > MAX_TOPK_PROMPT_LOGPROBS:
        raise invalid(f"topk_prompt_logprobs must be between 0 and {MAX_TOPK_PROMPT_LOGPROBS}, got {req.topk_prompt_logprobs}")
    if top_logprobs < 0 or top_logprobs > MAX_TOP_LOGPROBS:
        raise invalid(f"top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}, got {top_logprobs}")
    for t in stop_tokens:
        if t < 0 or t >= V:
            raise invalid(f"stop token {t} is outside the vocabulary [0, {V})")
    if stop_strings and bm.tokenizer is None:
        raise invalid(f"model {bm.name!r} has no tokenizer this worker can decode, so stop strings cannot be matched; use stop tokens")
    if top_p == 0:
        top_p = 1.0
    return SampleSpec(prompt=prompt, n=n, max_tokens=max_tokens, temperature=float(temp), top_k=int(top_k),
                      top_p=float(top_p), seed=seed, stop_tokens=stop_tokens, stop_strings=stop_strings,
                      prompt_logprobs=req.prompt_logprobs, topk=int(req.topk_prompt_logprobs), eos=list(bm.eos),
                      top_logprobs=int(top_logprobs))


def adapter_cache_key(bm, dir_: str) -> str:
    if not dir_ or not os.path.isabs(dir_):
        raise invalid(f"dir must be an absolute path, got {dir_!r}")
    try:
        st = os.stat(os.path.join(dir_, ckpt.ADAPTER_WEIGHTS))
    except OSError as e:
        raise invalid(f"adapter_dir {dir_} has no {ckpt.ADAPTER_WEIGHTS}: {e}")
    # Folders are immutable snapshots; size, times and inode guard against a rewritten folder.
    return f"{bm.name}|{dir_}|{st.st_size}|{st.st_mtime_ns}|{st.st_ctime_ns}|{st.st_ino}"


def sample_token(logits: np.ndarray, s: SampleSpec, rng: PCG):
    """nn.sampleToken on float64 logits: (token, log-prob, top), where top lists, with
    s.top_logprobs > 0, the most likely (token, log-prob) of the distribution the token was
    drawn from (ties: lower id first), else None."""
    k = s.top_logprobs
    if s.temperature <= 0:
        best = int(np.argmax(logits))
        mx = logits.max()
        lse = mx + math.log(np.exp(logits - mx).sum())
        top = None
        if k > 0:
            top = [(int(t), float(logits[t] - lse)) for t in np.argsort(-logits, kind="stable")[:k]]
        return best, float(logits[best] - lse), top
    inv = 1.0 / s.temperature
    V = logits.shape[0]
    cand = None
    if 0 < s.top_k < V:
        cand = np.argsort(-logits, kind="stable")[: s.top_k]
    if 0 < s.top_p < 1 and cand is None:
        cand = np.argsort(-logits, kind="stable")
    if cand is None:
        z = logits * inv
        mx = z.max()
        w = np.exp(z - mx)
        total = float(w.sum())
        u = rng.float64() * total
        acc = np.cumsum(w)
        hit = np.nonzero(acc > u)[0]
        tok = int(hit[0]) if len(hit) else V - 1
        top = None
        if k > 0:
            top = [(int(t), float(z[t] - mx - math.log(total))) for t in np.argsort(-logits, kind="stable")[:k]]
        return tok, float(z[tok] - mx - math.log(total)), top
    z = logits[cand] * inv
    w = np.exp(z - z[0])
    total = float(w.sum())
    if 0 < s.top_p < 1:
        acc = np.cumsum(w / total)
        hit = np.nonzero(acc >= s.top_p)[0]
        keep = int(hit[0]) + 1 if len(hit) else len(cand)
        cand, w = cand[:keep], w[:keep]
        total = float(w.sum())
    u = rng.float64() * total
    acc = np.cumsum(w)
    hit = np.nonzero(acc > u)[0]
    pick = int(hit[0]) if len(hit) else len(cand) - 1
    top = None
    if k > 0:
        top = [(int(cand[i]), float(math.log(w[i] / total))) for i in range(min(k, len(cand)))]
    return int(cand[pick]), float(math.log(w[pick] / total)), top


def top_rows(rows, k: int):
    """reference topKOf: k entries per row, missing ones as id 0 and log-prob -99999."""
    ids = [0] * (len(rows) * k)
    lps = [-99999.0] * (len(rows) * k)
    for r, row in enumerate(rows):
        for c, (t, lp) in enumerate(row or []):
            ids[r * k + c] = int(t)
            lps[r * k + c] = float(lp)
    return tpb.TopKLogprobs(k=k, length=len(rows), token_ids=ids, logprobs=lps)


def build_result(seqs, prompt_lp, topk_rows, spec: SampleSpec):
    """seqs: (tokens, logprobs, stopped[, top rows]) per sequence."""
    res = tpb.SampleResult()
    for seq in seqs:
        toks, lps, stopped = seq[0], seq[1], seq[2]
        out = tpb.SampledSequence(tokens=toks, logprobs=lps,
                                  stop_reason=tpb.STOP_REASON_STOP if stopped else tpb.STOP_REASON_LENGTH)
        if spec.top_logprobs > 0 and len(seq) > 3:
            out.top_logprobs.CopyFrom(top_rows(seq[3], spec.top_logprobs))
        res.sequences.append(out)
    if spec.prompt_logprobs and prompt_lp is not None:
        res.prompt_logprobs.extend(prompt_lp)
    if spec.topk > 0 and topk_rows is not None:
        L = len(spec.prompt)
        rows = list(topk_rows)[:L]
        res.topk_prompt_logprobs.CopyFrom(top_rows(rows + [[]] * (L - len(rows)), spec.topk))
    return bpb.SampleResponse(result=res)


class HFSampler:
    """Sampling with the trainer's own transformers model (CPU, or GPU without vLLM)."""

    name = "transformers"
    streams = True  # sample takes on_token

    def __init__(self, engine):
        self.engine = engine
        self.cache: "OrderedDict[str, object]" = OrderedDict()
        self.mu = threading.Lock()

    def _adapter(self, bm, dir_: str):
        key = adapter_cache_key(bm, dir_)
        with self.mu:
            if key in self.cache:
                self.cache.move_to_end(key)
                return self.cache[key]
        ad = self.engine.load_adapter_from(dir_, bm, False, adapter_id="sampler:" + dir_)
        with self.mu:
            self.cache[key] = ad
            while len(self.cache) > SAMPLER_CACHE_SIZE:
                self.cache.popitem(last=False)
        return ad

    def sample(self, req, on_token=None):
        """Samples req. on_token(sequence, token, logprob, top), when given, is called for
        every token as it is sampled (top: the (token, log-prob) alternatives or None); an
        exception it raises stops the sample."""
        bm = self.engine.model(req.base_model)
        spec = validate(req, bm)
        ad = self._adapter(bm, req.adapter_dir) if req.adapter_dir else None
        with self.engine.compute:
            seqs, plp, topk = self._generate(bm, ad, spec, on_token)
        return build_result(seqs, plp, topk, spec)

    @torch.no_grad()
    def _generate(self, bm, ad, s: SampleSpec, on_token=None):
        from transformers import DynamicCache

        model = bm.model
        dev = bm.device
        V = bm.vocab
        bm.ctx.segments = [(0, 1 << 30, ad)]
        try:
            ids = torch.tensor([s.prompt], dtype=torch.long, device=dev)
            cache = DynamicCache(config=model.config)
            want_prompt = s.prompt_logprobs or s.topk > 0
            out = model(input_ids=ids, past_key_values=cache, use_cache=True,
                        logits_to_keep=0 if want_prompt else 1)
            logits = out.logits[0].to(torch.float64).cpu()
            plp, topk = None, None
            if want_prompt:
                lse = torch.logsumexp(logits, dim=-1)
                if s.prompt_logprobs:
                    plp = [float("nan")]
                    for r in range(len(s.prompt) - 1):
                        plp.append(float(logits[r, s.prompt[r + 1]] - lse[r]))
                if s.topk > 0:
                    topk = [[]]
                    k = min(s.topk, V)
                    for r in range(len(s.prompt) - 1):
                        row = logits[r].numpy()
                        idx = np.argsort(-row, kind="stable")[:k]
                        topk.append([(int(t), float(row[t] - float(lse[r]))) for t in idx])
            last = logits[-1].numpy()
            n = s.n
            seed = s.seed if s.seed is not None else random.getrandbits(64)
            rngs = [PCG(seed, (i + 0x5851F42D4C957F2D) & ((1 << 64) - 1)) for i in range(n)]
            stops = set(s.stop_tokens) | set(s.eos)
            toks: List[List[int]] = [[] for _ in range(n)]
            lps: List[List[float]] = [[] for _ in range(n)]
            tops: List[list] = [[] for _ in range(n)]
            stopped = [False] * n
            active = list(range(n))
            if n > 1:
                cache.batch_repeat_interleave(n)
            rows = [last] * n
            for step in range(s.max_tokens):
                nxt = []
                for i in active:
                    t, lp, top = sample_token(rows[i], s, rngs[i])
                    toks[i].append(t)
                    lps[i].append(lp)
                    tops[i].append(top)
                    if on_token is not None:
                        on_token(i, t, lp, top)
                    if t in stops:
                        stopped[i] = True
                        continue
                    if s.stop_strings:
                        text = bm.tokenizer.decode(toks[i])
                        if any(st and st in text for st in s.stop_strings):
                            stopped[i] = True
                            continue
                    nxt.append(i)
                active = nxt
                if not active or step + 1 >= s.max_tokens:
                    break
                # every row advances (finished rows feed their last token; results ignored)
                feed = torch.tensor([[toks[i][-1]] for i in range(n)], dtype=torch.long, device=dev)
                out = model(input_ids=feed, past_key_values=cache, use_cache=True)
                lg = out.logits[:, -1].to(torch.float64).cpu().numpy()
                rows = [lg[i] for i in range(n)]
            return [(toks[i], lps[i], stopped[i], tops[i]) for i in range(n)], plp, topk
        finally:
            bm.ctx.segments = []
