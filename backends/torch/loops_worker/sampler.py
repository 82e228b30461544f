"""Sampling: request validation (shared by both paths) and the transformers sampler.

The transformers path mirrors the reference engine's nn.Sample: the prompt is run once and
its KV cache repeated per sample; sample i draws from Go's PCG(seed, i + 0x5851f42d4c957f2d);
the distribution is softmax(logits/T) cut to top_k then top_p and renormalised, and the
reported log-prob is the token's log-prob under exactly that distribution (temperature 0:
greedy, log-prob at temperature 1). Stop tokens, the model's EOS ids and stop strings end a
sequence, which includes the stop. Prompt log-probs at temperature 1, first NaN.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import List, Optional

import numpy as np
import torch

from . import adjust
from . import checkpoint as ckpt
from . import full
from .errors import FAILED_PRECONDITION, WorkerError, invalid
from .pcg import PCG
from .proto import bpb, tpb

MAX_SAMPLES = 256
MAX_TOPK_PROMPT_LOGPROBS = 1024
MAX_TOP_LOGPROBS = 20  # semantics.MaxTopLogprobs
SAMPLER_CACHE_SIZE = 16
# Full fine-tuning sampler checkpoints (whole models) held loaded at once.
FULL_SAMPLER_CACHE_SIZE = 1


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
    # target_prompt_tokens: per prompt position after the first, the ids to score (-1: none)
    targets: Optional[List[List[int]]] = None
    alt_k: int = 0  # prompt_alt_tokens_k
    # logit adjustments and structured outputs (adjust.py)
    logit_bias: dict = field(default_factory=dict)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    min_p: float = 0.0
    response_format: Optional[tuple] = None  # ("json_object" | "json_schema", schema)
    # image chunks (a VL model): the model's input ids (the image token at the images'
    # positions, which prompt holds as 0) and the images (engine.RowImages)
    input_ids: Optional[List[int]] = None
    images: Optional[object] = None

    @property
    def want_prompt(self) -> bool:
        """Whether the logits of every prompt position are needed."""
        return self.prompt_logprobs or self.topk > 0 or self.targets is not None or self.alt_k > 0


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
        bias, presence, frequency, min_p, rf = adjust.check(p, V)
    else:
        bias, presence, frequency, min_p, rf = {}, 0.0, 0.0, 0.0, None
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
    alt_k = int(req.prompt_alt_tokens_k)
    if alt_k < 0 or alt_k > MAX_TOPK_PROMPT_LOGPROBS:
        raise invalid(f"prompt_alt_tokens_k must be between 0 and {MAX_TOPK_PROMPT_LOGPROBS}, got {alt_k}")
    if alt_k > 0 and len(prompt) < 2:
        raise invalid("prompt_alt_tokens_k needs a prompt of at least 2 tokens (draws are made at every position after the first)")
    targets = target_rows(req, len(prompt), V)
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
                      top_logprobs=int(top_logprobs), targets=targets, alt_k=alt_k, logit_bias=bias,
                      presence_penalty=presence, frequency_penalty=frequency, min_p=min_p, response_format=rf)


def validate_embed(req, bm) -> List[int]:
    """reference.Engine.embed's checks of a request to embed its prompt (SampleRequest.embed)."""
    V = bm.vocab
    prompt = list(req.prompt)
    if not prompt:
        raise invalid("the prompt is empty; send at least one token")
    for i, t in enumerate(prompt):
        if t < 0 or t >= V:
            raise invalid(f"prompt token {t} at position {i} is outside the vocabulary [0, {V})")
    if len(prompt) > bm.max_seq:
        raise invalid(f"the input of {len(prompt)} tokens exceeds the model's limit of {bm.max_seq} tokens; shorten it")
    if req.num_samples > 1 or req.num_samples < 0 or req.HasField("params"):
        raise invalid("embed samples nothing: leave num_samples (or set it to 1) and params unset")
    if (req.prompt_logprobs or req.topk_prompt_logprobs or req.HasField("target_prompt_tokens")
            or req.prompt_alt_tokens_k):
        raise invalid("embed returns no prompt log-probs: leave prompt_logprobs, topk_prompt_logprobs, "
                      "target_prompt_tokens and prompt_alt_tokens_k unset")
    return prompt


def target_rows(req, prompt_len: int, vocab: int) -> Optional[List[List[int]]]:
    """reference targetRows: target_prompt_tokens ([len(prompt) - 1, k] row major, ids in the
    vocabulary or -1) cut into rows; None when none are asked for."""
    if not req.HasField("target_prompt_tokens"):
        return None
    ids, k = list(req.target_prompt_tokens.token_ids), int(req.target_prompt_tokens.k)
    if not ids and k == 0:
        return None
    if k < 1 or k > MAX_TOPK_PROMPT_LOGPROBS:
        raise invalid(f"target_prompt_tokens.k must be between 1 and {MAX_TOPK_PROMPT_LOGPROBS}, got {k}")
    if prompt_len < 2:
        raise invalid("target_prompt_tokens needs a prompt of at least 2 tokens (position 0 has no preceding context)")
    if len(ids) != (prompt_len - 1) * k:
        raise invalid(f"target_prompt_tokens has {len(ids)} ids; a prompt of {prompt_len} tokens with k {k} needs "
                      f"{(prompt_len - 1) * k} ([len(prompt) - 1, k])")
    for c, t in enumerate(ids):
        if t < -1 or t >= vocab:
            raise invalid(f"target_prompt_tokens[{c // k}][{c % k}] = {t} is outside the vocabulary [0, {vocab}) (use -1 for no id)")
    return [ids[i * k:(i + 1) * k] for i in range(prompt_len - 1)]


ALT_STREAM = 0x5851F42D4C957F2D - 1  # nn.altStream: the stream before sample 0's


def draw_alts(row: np.ndarray, lse: float, s: SampleSpec, rng: PCG):
    """nn.Gen.drawAlts: s.alt_k draws from softmax(row / T) over the whole vocabulary
    (temperature 0: the argmax k times), each as sample_token draws one (u = float64() *
    sum, the first token whose running sum passes u), with its log-prob at temperature 1."""
    k = s.alt_k
    if s.temperature <= 0:
        best = int(np.argmax(row))
        return [(best, float(row[best] - lse))] * k
    z = row * (1.0 / s.temperature)
    acc = np.cumsum(np.exp(z - z.max()))
    total = float(acc[-1])
    out = []
    for _ in range(k):
        u = rng.float64() * total
        tok = min(int(np.searchsorted(acc, u, side="right")), len(acc) - 1)
        out.append((tok, float(row[tok] - lse)))
    return out


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
            top = [(int(t), float(logits[t] - lse)) for t in np.argsort(-logits, kind="stable")[:k] if np.isfinite(logits[t])]
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
            top = [(int(t), float(z[t] - mx - math.log(total))) for t in np.argsort(-logits, kind="stable")[:k]
                   if np.isfinite(z[t])]
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
        top = [(int(cand[i]), float(math.log(w[i] / total))) for i in range(min(k, len(cand))) if w[i] > 0]
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


def build_result(seqs, prompt_lp, topk_rows, spec: SampleSpec, extras=None):
    """seqs: (tokens, logprobs, stopped[, top rows]) per sequence; extras: (target rows,
    alt rows) as prompt_extras computes them, or None."""
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
    targets, alts = extras if extras is not None else (None, None)
    if spec.targets is not None and targets is not None:
        res.target_prompt_logprobs.k = len(spec.targets[0])
        res.target_prompt_logprobs.logprobs.extend(v for row in targets for v in row)
    if spec.alt_k > 0 and alts is not None:
        res.prompt_alt_tokens.k = spec.alt_k
        res.prompt_alt_tokens.token_ids.extend(t for row in alts for t, _ in row)
        res.prompt_alt_tokens.logprobs.extend(lp for row in alts for _, lp in row)
    return bpb.SampleResponse(result=res)


def prompt_extras(logits: torch.Tensor, lse: torch.Tensor, s: SampleSpec, seed: int):
    """target_prompt_tokens' log-probs (NaN for -1) and prompt_alt_tokens_k's draws from the
    float64 logits of every prompt position (row r predicts prompt token r + 1)."""
    targets, alts = None, None
    if s.targets is not None:
        ids = torch.tensor(s.targets, dtype=torch.long)  # [len(prompt) - 1, k]
        rows = len(s.targets)
        lp = logits[:rows].gather(1, ids.clamp(min=0)) - lse[:rows, None]
        targets = torch.where(ids >= 0, lp, torch.full_like(lp, float("nan"))).tolist()
    if s.alt_k > 0:
        rng = PCG(seed, ALT_STREAM)
        alts = [draw_alts(logits[r].numpy(), float(lse[r]), s, rng) for r in range(len(s.prompt) - 1)]
    return targets, alts


def _repeatable(layer) -> bool:
    """Whether a cache layer's batch_repeat_interleave repeats all of its state: its own class
    defines it, or it is transformers' DynamicSlidingWindowLayer (keys and values only, as its
    parent DynamicLayer). A subclass that inherits the method but adds state (DeepSeek-V4's
    compressed-attention layers keep compressor buffers) is not repeatable."""
    from transformers.cache_utils import DynamicSlidingWindowLayer

    t = type(layer)
    return "batch_repeat_interleave" in t.__dict__ or t is DynamicSlidingWindowLayer


class HFSampler:
    """Sampling with the trainer's own transformers model (CPU, or GPU without vLLM).

    On a multi-rank replica (shard.py) lockstep is rank 0's shard.Leader: a sample holds the
    replica's command order for its whole run (Leader.sampling) and every forward pass is
    announced to the other ranks first (Leader.sample_pass), which run a pass of their own
    so that the sharded base's all-gathers find every rank; rank 0 alone samples and answers."""

    name = "transformers"
    streams = True  # sample takes on_token

    def __init__(self, engine, lockstep=None):
        self.engine = engine
        self.lockstep = lockstep
        self.cache: "OrderedDict[str, object]" = OrderedDict()
        self.full_cache: "OrderedDict[str, object]" = OrderedDict()
        self.mu = threading.Lock()
        self.grammars = adjust.Grammars()

    def _weights(self, bm, dir_: str):
        """(model, adapter) a sample computes with: bm and dir_'s LoRA adapter (None: no
        dir_), or a full fine-tuning checkpoint's own model (full.py) and no adapter."""
        if not dir_:
            return bm, None
        if full.is_full_dir(dir_):
            if self.lockstep is not None:  # the other ranks hold the base model only
                raise WorkerError(FAILED_PRECONDITION, f"{dir_} is a full fine-tuning checkpoint (a whole model); a multi-rank "
                                  f"replica samples LoRA adapters on its base only: sample it on a one-rank sampler replica")
            return self._full(bm, dir_), None
        return bm, self._adapter(bm, dir_)

    def _full(self, bm, dir_: str):
        """A full fine-tuning sampler checkpoint loaded as a model of its own (the Hugging Face
        folder, as from_pretrained loads it), cached by folder."""
        from .engine import BaseModel

        if not os.path.isabs(dir_):
            raise invalid(f"dir must be an absolute path, got {dir_!r}")
        try:
            mk = full.read_marker(dir_)
            key = full.marker_key(dir_)
        except (OSError, ValueError) as e:
            raise invalid(f"cannot sample full fine-tuning checkpoint {dir_}: {e}")
        if mk["base_model"] != bm.name:
            raise invalid(f"{dir_} is a full fine-tuning checkpoint of {mk['base_model']!r}, not of {bm.name!r}; "
                          f"sample it with base model {mk['base_model']!r}")
        with self.mu:
            m = self.full_cache.get(key)
            if m is not None:
                self.full_cache.move_to_end(key)
                return m
        with self.engine.compute:
            m = BaseModel(bm.name, dir_, bm.device, bm.dtype, lora=False, **bm.options)
        with self.mu:
            self.full_cache[key] = m
            while len(self.full_cache) > FULL_SAMPLER_CACHE_SIZE:
                self.full_cache.popitem(last=False)
        return m

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
        if req.embed:
            if len(req.prompt_images) > 0:
                raise invalid("an embedding takes a text prompt; send it without images")
            prompt = validate_embed(req, bm)
            bm, ad = self._weights(bm, req.adapter_dir)
            with self._passes():
                return self._embed(bm, ad, prompt)
        spec = validate(req, bm)
        if len(req.prompt_images) > 0:
            spec.input_ids, spec.images = bm.row_images("prompt", spec.prompt, req.prompt_images)
        bm, ad = self._weights(bm, req.adapter_dir)
        if spec.response_format is not None:
            self.grammars.matcher(bm, spec.response_format)  # refuse a schema before any compute
        with self._passes():
            seqs, plp, topk, extras = self._generate(bm, ad, spec, on_token)
        return build_result(seqs, plp, topk, spec, extras)

    @contextlib.contextmanager
    def _passes(self):
        """Holds what one sample's forward passes need: the engine's compute lock, and on a
        multi-rank replica the replica's command order before it (the Leader's order of locks)."""
        if self.lockstep is None:
            with self.engine.compute:
                yield
            return
        with self.lockstep.sampling(), self.engine.compute:
            yield

    def _forward(self, bm, module=None, **kw):
        """One forward pass of bm's model, or of its module (with every rank of a multi-rank
        replica: class doc)."""
        m = bm.model if module is None else module
        if self.lockstep is None:
            return m(**kw)
        return self.lockstep.sample_pass(bm.name, lambda: m(**kw))

    @torch.no_grad()
    def _embed(self, bm, ad, prompt: List[int]):
        """SampleRequest.embed: the mean over the prompt's tokens of the last hidden state
        (the decoder stack's output after its final norm, transformers' hidden_states[-1]),
        summed in float64, as float32. The stack is called for it: a sharded stack (shard.py)
        records no hidden_states."""
        bm.ctx.segments = [(0, 1 << 30, ad)]
        try:
            ids = torch.tensor([prompt], dtype=torch.long, device=bm.device)
            out = self._forward(bm, module=bm.model.model, input_ids=ids, use_cache=False)
            mean = out.last_hidden_state[0].to(torch.float64).mean(dim=0).cpu()
        finally:
            bm.ctx.segments = []
        res = tpb.SampleResult()
        res.embedding.extend(mean.to(torch.float32).tolist())
        return bpb.SampleResponse(result=res)

    @torch.no_grad()
    def _generate(self, bm, ad, s: SampleSpec, on_token=None):
        from transformers import DynamicCache

        model = bm.model
        dev = bm.device
        V = bm.vocab
        bm.ctx.segments = [(0, 1 << 30, ad)]
        try:
            ids = torch.tensor([s.input_ids if s.input_ids is not None else s.prompt], dtype=torch.long, device=dev)
            cache = DynamicCache(config=model.config)
            # the prompt's cache is repeated per sample; a cache that cannot be repeated
            # (linear attention's recurrent state: Qwen3.5; DeepSeek-V4's compressor buffers)
            # gets the prompt once per sample
            repeat = s.n > 1 and all(_repeatable(layer) for layer in cache.layers)
            rows = 1
            if s.n > 1 and not repeat:
                ids = ids.repeat(s.n, 1)
                rows = s.n
            # a VL model's image arguments (none for a text prompt; clears its cached
            # multimodal positions either way, so decoding uses this prompt's)
            vis = bm.vision_inputs([s.images] * rows, len(s.prompt))
            want_prompt = s.want_prompt
            out = self._forward(bm, input_ids=ids, past_key_values=cache, use_cache=True,
                                logits_to_keep=0 if want_prompt else 1, **vis)
            logits = out.logits[0].to(torch.float64).cpu()
            plp, topk, extras = None, None, None
            seed = s.seed if s.seed is not None else random.getrandbits(64)
            if want_prompt:
                lse = torch.logsumexp(logits, dim=-1)
                if s.prompt_logprobs:
                    plp = [float("nan")]
                    kinds = s.images.kinds if s.images is not None else None
                    for r in range(len(s.prompt) - 1):
                        # an image position is an input, not a token: no log-prob (NaN)
                        image = kinds is not None and kinds[r + 1] == 1
                        plp.append(float("nan") if image else float(logits[r, s.prompt[r + 1]] - lse[r]))
                if s.topk > 0:
                    topk = [[]]
                    k = min(s.topk, V)
                    for r in range(len(s.prompt) - 1):
                        row = logits[r].numpy()
                        idx = np.argsort(-row, kind="stable")[:k]
                        topk.append([(int(t), float(row[t] - float(lse[r]))) for t in idx])
                extras = prompt_extras(logits, lse, s, seed)
            last = logits[-1].numpy()
            n = s.n
            rngs = [PCG(seed, (i + 0x5851F42D4C957F2D) & ((1 << 64) - 1)) for i in range(n)]
            stops = set(s.stop_tokens) | set(s.eos)
            toks: List[List[int]] = [[] for _ in range(n)]
            lps: List[List[float]] = [[] for _ in range(n)]
            tops: List[list] = [[] for _ in range(n)]
            stopped = [False] * n
            adjusting = adjust.adjusts(s)
            counts: List[dict] = [{} for _ in range(n)]
            matchers = [self.grammars.matcher(bm, s.response_format) for _ in range(n)] if s.response_format else None
            active = list(range(n))
            if repeat:
                cache.batch_repeat_interleave(n)
            rows = [last] * n
            for step in range(s.max_tokens):
                nxt = []
                for i in active:
                    row = rows[i]
                    if adjusting:
                        allowed = adjust.allowed_tokens(matchers[i], V) if matchers else None
                        row = adjust.adjust(row, s, counts[i], allowed)
                        if row is None:
                            continue  # the constraint allows nothing: ends unfinished
                    t, lp, top = sample_token(row, s, rngs[i])
                    counts[i][t] = counts[i].get(t, 0) + 1
                    if matchers:
                        matchers[i].consume_token(t)
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
                out = self._forward(bm, input_ids=feed, past_key_values=cache, use_cache=True)
                lg = out.logits[:, -1].to(torch.float64).cpu().numpy()
                rows = [lg[i] for i in range(n)]
            return [(toks[i], lps[i], stopped[i], tops[i]) for i in range(n)], plp, topk, extras
        finally:
            bm.ctx.segments = []
