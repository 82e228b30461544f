"""Logit adjustments against an independent float64 computation, structured outputs
through llguidance on a tiny random model with a byte-level tokenizer, and the vLLM
parameters built for both."""

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest

from loops_worker import adjust
from loops_worker.pcg import PCG
from loops_worker.proto import bpb, tpb
from loops_worker.sampler import HFSampler, SampleSpec, sample_token


def spec(**kw):
    base = dict(prompt=[1], n=1, max_tokens=1, temperature=1.0, top_k=0, top_p=1.0, seed=1, stop_tokens=[],
                stop_strings=[], prompt_logprobs=False, topk=0)
    base.update(kw)
    return SampleSpec(**base)


def expected(logits, s, counts):
    """docs/openai.md's distribution, written out in float64: log-probs, -inf outside."""
    l = np.array(logits, dtype=np.float64)
    for t, b in s.logit_bias.items():
        l[t] += b
    for t, c in counts.items():
        l[t] -= c * s.frequency_penalty + s.presence_penalty
    z = l / s.temperature
    p = np.exp(z - z.max())
    p /= p.sum()
    keep = [t for t in range(len(p)) if p[t] >= s.min_p * p.max()]
    keep.sort(key=lambda t: -p[t])
    if 0 < s.top_k < len(keep):
        keep = keep[: s.top_k]
    if 0 < s.top_p < 1:
        tot, acc = sum(p[t] for t in keep), 0.0
        for i, t in enumerate(keep):
            acc += p[t] / tot
            if acc >= s.top_p:
                keep = keep[: i + 1]
                break
    out = np.full(len(p), -np.inf)
    zsum = sum(p[t] for t in keep)
    for t in keep:
        out[t] = math.log(p[t] / zsum)
    return out


@pytest.mark.parametrize("kw", [
    dict(temperature=0.9, logit_bias={3: 3.5, 10: -100, 40: 2.0}, presence_penalty=0.7, frequency_penalty=0.4, top_logprobs=20),
    dict(temperature=1.3, top_p=0.9, top_k=30, min_p=0.05, presence_penalty=-1.5, frequency_penalty=2.0, top_logprobs=5),
    dict(temperature=0.7, min_p=0.2, frequency_penalty=-0.5, logit_bias={7: 1.25}),
])
def test_adjustments_match_float64(kw):
    rng = np.random.default_rng(7)
    s = spec(**kw)
    counts = {3: 2, 5: 1, 7: 4}
    for step in range(20):
        logits = rng.normal(0, 2, 64)
        want = expected(logits, s, counts)
        row = adjust.adjust(logits, s, counts, None)
        a = sample_token(row, s, PCG(step, 1))
        b = sample_token(adjust.adjust(logits, s, counts, None), s, PCG(step, 1))
        assert a[0] == b[0], "same seed, same token"
        tok, lp, top = a
        assert np.isfinite(want[tok])
        assert lp == pytest.approx(want[tok], abs=1e-9)
        for t, v in top or []:
            assert v == pytest.approx(want[t], abs=1e-9)


def test_adjust_mask_and_checks():
    s = spec(logit_bias={}, response_format=("json_object", ""))
    allowed = np.zeros(8, dtype=bool)
    assert adjust.adjust(np.zeros(8), s, {}, allowed) is None
    allowed[3] = True
    tok, lp, _ = sample_token(adjust.adjust(np.zeros(8), s, {}, allowed), s, PCG(1, 1))
    assert tok == 3 and lp == 0.0
    for bad in [dict(logit_bias={1: 101.0}), dict(logit_bias={999: 1.0}), dict(presence_penalty=2.5), dict(min_p=1.5),
                dict(stop_strings=["x"], response_format=tpb.ResponseFormat(type=tpb.ResponseFormat.TYPE_JSON_OBJECT))]:
        with pytest.raises(Exception):
            adjust.check(tpb.SamplingParams(max_tokens=1, temperature=1, **bad), 64)


def test_vllm_kwargs():
    cls = lambda **kw: SimpleNamespace(**kw)  # noqa: E731 - stands for StructuredOutputsParams
    s = spec(logit_bias={4: -2.0}, presence_penalty=0.5, frequency_penalty=-0.25, min_p=0.1,
             response_format=("json_schema", '{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]}'))
    kw = adjust.vllm_kwargs(s, cls)
    assert kw["logit_bias"] == {4: -2.0} and kw["presence_penalty"] == 0.5 and kw["frequency_penalty"] == -0.25
    assert kw["min_p"] == 0.1
    bound = 10**15 - 1  # the reference engine's 15 digits, as the transformers sampler's grammar
    assert kw["structured_outputs"].json == {"type": "object", "required": ["a"],
                                             "properties": {"a": {"type": "integer", "minimum": -bound, "maximum": bound}}}
    assert adjust.vllm_kwargs(spec(response_format=("json_object", "")), cls)["structured_outputs"].json_object is True
    assert adjust.vllm_kwargs(spec()) == {}


@pytest.fixture(scope="module")
def tok_engine(tmp_path_factory):
    """A tiny random Qwen3 with a byte-level tokenizer (256 bytes, then <|endoftext|>)."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    from loops_worker.engine import BaseModel, Engine

    d = tmp_path_factory.mktemp("tiny-tok")
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tk = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens(["<|endoftext|>"])
    PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|endoftext|>").save_pretrained(str(d))
    cfg = Qwen3Config(vocab_size=264, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=16, max_position_embeddings=512, tie_word_embeddings=False,
                      rms_norm_eps=1e-6, eos_token_id=256, bos_token_id=256)
    torch.manual_seed(99)
    Qwen3ForCausalLM(cfg).save_pretrained(str(d))
    bm = BaseModel("tok", str(d), torch.device("cpu"), torch.float32, 64)
    return Engine({"tok": bm}, ["tok"])


def test_structured_outputs_with_llguidance(tok_engine):
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "n": {"type": "integer"},
                                               "ok": {"type": "boolean"}, "k": {"enum": ["a", "b"]}},
              "required": ["name", "n", "ok", "k"], "additionalProperties": False}
    sampler = HFSampler(tok_engine)
    bm = tok_engine.model("tok")
    done = 0
    for kind, body in [(tpb.ResponseFormat.TYPE_JSON_SCHEMA, json.dumps(schema)), (tpb.ResponseFormat.TYPE_JSON_OBJECT, "")]:
        p = tpb.SamplingParams(max_tokens=200, temperature=1.0, top_p=1.0, seed=5,
                               response_format=tpb.ResponseFormat(type=kind, json_schema=body))
        res = sampler.sample(bpb.SampleRequest(base_model="tok", prompt=list(b"JSON: "), num_samples=3, params=p))
        for seq in res.result.sequences:
            toks = list(seq.tokens)
            if seq.stop_reason != tpb.STOP_REASON_STOP:
                assert len(toks) == 200
                continue
            done += 1
            assert toks[-1] in bm.eos
            v = json.loads(bm.tokenizer.decode(toks[:-1]))
            assert isinstance(v, dict)
            if kind == tpb.ResponseFormat.TYPE_JSON_SCHEMA:
                assert list(v) == ["name", "n", "ok", "k"]
                assert isinstance(v["name"], str) and isinstance(v["n"], int) and isinstance(v["ok"], bool)
                assert v["k"] in ("a", "b")
    assert done > 0
    with pytest.raises(Exception):
        bad = tpb.SamplingParams(max_tokens=2, temperature=1.0, response_format=tpb.ResponseFormat(
            type=tpb.ResponseFormat.TYPE_JSON_SCHEMA, json_schema='{"type": "nonsense"}'))
        sampler.sample(bpb.SampleRequest(base_model="tok", prompt=[1, 2], params=bad))


def test_integers_have_at_most_15_digits(tok_engine):
    """The reference engine's integers have at most 15 digits (fit an int64); llguidance's
    are unbounded unless the schema bounds them (adjust.bounded_integers)."""
    schema = {"type": "object", "properties": {"n": {"type": "integer"}, "m": {"type": ["integer", "null"]},
                                               "xs": {"type": "array", "items": {"anyOf": [{"type": "integer"}, {"type": "string"}]}}},
              "required": ["n", "m", "xs"], "additionalProperties": False}
    assert adjust.bounded_integers(schema)["properties"]["n"] == {"type": "integer", "minimum": -(10**15 - 1), "maximum": 10**15 - 1}
    bm = tok_engine.model("tok")
    g = adjust.Grammars()
    for text, ok in [('{"n":999999999999999,"m":null,"xs":[-999999999999999,"a"]}', True),
                     ('{"n":1000000000000000,"m":null,"xs":[]}', False),
                     ('{"n":1,"m":-1000000000000000,"xs":[]}', False),
                     ('{"n":1,"m":2,"xs":[12345678901234567]}', False)]:
        m = g.matcher(bm, ("json_schema", json.dumps(schema)))
        ids = bm.tokenizer.encode(text, add_special_tokens=False)
        assert (m.try_consume_tokens(ids) == len(ids) and m.is_accepting()) == ok, text
