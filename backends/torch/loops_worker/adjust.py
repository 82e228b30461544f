"""Logit adjustments and structured outputs for the transformers sampler, as the reference
engine applies them (backends/reference/nn adjustLogits; docs/openai.md):

    l[t] += logit_bias[t] - frequency_penalty * c[t] - presence_penalty * (c[t] > 0)

(c[t]: how many times the sequence has sampled t), then the tokens a response_format does
not allow set to -inf, then, with temperature > 0 and min_p > 0, the tokens with
l[t] < max(l) + temperature * ln(min_p) (probability below min_p times the largest) set to
-inf; sample_token then applies temperature, top_k and top_p.

Structured outputs go through llguidance: the schema (or {"type": "object"} for
json_object) becomes a grammar of compact JSON, and an LLMatcher per sequence gives the
allowed tokens at each step (its end-of-sequence tokens only once the JSON is complete).
Integers are bounded to the reference engine's 15 digits (bounded_integers), so that an
answer's integers fit an int64 on both engines.
"""

from __future__ import annotations

import json
import math
import threading
from collections import OrderedDict
from typing import Dict, List, Optional, Tuple

import numpy as np

from .errors import invalid
from .proto import tpb

# internal/semantics' limits (CheckAdjustments)
MAX_LOGIT_BIAS = 100
MAX_LOGIT_BIAS_ENTRIES = 300
MAX_PENALTY = 2

# compact JSON, as the reference engine's automaton writes it
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}

GRAMMAR_CACHE_SIZE = 256

# the reference engine's integers: at most 15 digits (internal/constrain maxIntDigits)
MAX_INT = 10**15 - 1


def check(p, vocab: int) -> Tuple[Dict[int, float], float, float, float, Optional[Tuple[str, str]]]:
    """semantics.CheckAdjustments: (logit_bias, presence, frequency, min_p, response_format)
    where response_format is None or ("json_object" | "json_schema", schema JSON)."""
    bias = dict(p.logit_bias)
    if len(bias) > MAX_LOGIT_BIAS_ENTRIES:
        raise invalid(f"logit_bias has {len(bias)} entries; at most {MAX_LOGIT_BIAS_ENTRIES} are allowed")
    for t, b in bias.items():
        if t < 0 or t >= vocab:
            raise invalid(f"logit_bias token {t} is outside the vocabulary [0, {vocab})")
        if not (-MAX_LOGIT_BIAS <= b <= MAX_LOGIT_BIAS):
            raise invalid(f"logit_bias of token {t} is {b:g}; biases must be in [-{MAX_LOGIT_BIAS}, {MAX_LOGIT_BIAS}]")
    for name in ("presence_penalty", "frequency_penalty"):
        v = getattr(p, name)
        if not (-MAX_PENALTY <= v <= MAX_PENALTY):
            raise invalid(f"{name} must be in [-{MAX_PENALTY}, {MAX_PENALTY}], got {v:g}")
    if not (0 <= p.min_p <= 1):
        raise invalid(f"min_p must be in [0, 1], got {p.min_p:g}")
    rf = None
    if p.HasField("response_format"):
        t, schema = p.response_format.type, p.response_format.json_schema
        if t == tpb.ResponseFormat.TYPE_JSON_OBJECT:
            rf = ("json_object", "")
        elif t == tpb.ResponseFormat.TYPE_JSON_SCHEMA:
            if not schema:
                raise invalid("response_format TYPE_JSON_SCHEMA needs json_schema")
            rf = ("json_schema", schema)
        if rf is not None and schema and t != tpb.ResponseFormat.TYPE_JSON_SCHEMA:
            raise invalid("response_format.json_schema is only for type TYPE_JSON_SCHEMA")
    if rf is not None and (len(p.stop_strings) or len(p.stop_tokens)):
        raise invalid("stop sequences cannot be combined with a JSON response_format (a stop would cut the JSON short): leave stop out")
    return bias, float(p.presence_penalty), float(p.frequency_penalty), float(p.min_p), rf


def adjusts(s) -> bool:
    return bool(s.logit_bias) or s.presence_penalty != 0 or s.frequency_penalty != 0 or s.min_p > 0 or s.response_format is not None


def adjust(logits: np.ndarray, s, counts: Dict[int, int], allowed: Optional[np.ndarray]) -> Optional[np.ndarray]:
    """The adjusted float64 logits (a copy), or None when no token is left. allowed is the
    constraint's boolean mask over the vocabulary, or None."""
    row = np.array(logits, dtype=np.float64, copy=True)
    for t, b in s.logit_bias.items():
        row[t] += b
    if s.presence_penalty != 0 or s.frequency_penalty != 0:
        for t, c in counts.items():
            row[t] -= c * s.frequency_penalty + s.presence_penalty
    if allowed is not None:
        n = min(len(allowed), len(row))
        row[:n][~allowed[:n]] = -np.inf
        row[n:] = -np.inf
        if not np.isfinite(row).any():
            return None
    if s.min_p > 0 and s.temperature > 0:
        thr = row.max() + s.temperature * math.log(s.min_p)
        row[row < thr] = -np.inf
    return row


def bounded_integers(schema):
    """schema with minimum -MAX_INT and maximum MAX_INT on every subschema that allows
    integers (llguidance compiles them to a range), so that the torch worker's integers have
    at most 15 digits, as the reference engine's; the supported subset has no minimum or
    maximum of its own (internal/constrain refuses them), so none is overridden."""
    if isinstance(schema, list):
        return [bounded_integers(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for k, v in schema.items():
        if k in ("properties", "$defs", "definitions") and isinstance(v, dict):
            out[k] = {name: bounded_integers(s) for name, s in v.items()}
        elif k in ("items", "additionalProperties", "anyOf"):
            out[k] = bounded_integers(v)
        else:
            out[k] = v
    t = schema.get("type")
    t = t if isinstance(t, list) else [t]
    if "integer" in t and "number" not in t:  # a number's range is its exponent's
        out.setdefault("minimum", -MAX_INT)
        out.setdefault("maximum", MAX_INT)
    return out


class Grammars:
    """llguidance tokenizers per base model and grammars per (kind, schema), in bounded
    caches; matcher() starts one sequence's LLMatcher."""

    def __init__(self):
        self.mu = threading.Lock()
        self.tokenizers: Dict[str, object] = {}
        self.grammars: "OrderedDict[str, str]" = OrderedDict()

    def tokenizer(self, bm):
        import llguidance.hf

        with self.mu:
            t = self.tokenizers.get(bm.name)
        if t is None:
            if bm.tokenizer is None:
                raise invalid(f"model {bm.name!r} has no tokenizer this worker can read, so a response_format cannot be enforced")
            if not bm.eos:
                raise invalid(f"model {bm.name!r} has no end-of-sequence token, so a response_format cannot end its output")
            t = llguidance.hf.from_tokenizer(bm.tokenizer, n_vocab=bm.vocab, eos_token=list(bm.eos))
            with self.mu:
                self.tokenizers[bm.name] = t
        return t

    def grammar(self, rf: Tuple[str, str]) -> str:
        from llguidance import LLMatcher

        key = rf[0] + "\x00" + rf[1]
        with self.mu:
            g = self.grammars.get(key)
            if g is not None:
                self.grammars.move_to_end(key)
                return g
        schema = {"type": "object"} if rf[0] == "json_object" else bounded_integers(json.loads(rf[1]))
        try:
            g = LLMatcher.grammar_from_json_schema(schema, overrides=JSON_OPTIONS)
        except ValueError as e:
            raise invalid(f"response_format.json_schema: {e}")
        err = LLMatcher.validate_grammar(g)
        if err:
            raise invalid(f"response_format.json_schema cannot be enforced: {err}")
        with self.mu:
            self.grammars[key] = g
            while len(self.grammars) > GRAMMAR_CACHE_SIZE:
                self.grammars.popitem(last=False)
        return g

    def matcher(self, bm, rf: Tuple[str, str]):
        from llguidance import LLMatcher

        m = LLMatcher(self.tokenizer(bm), self.grammar(rf), log_level=0)
        if m.is_error():
            raise invalid(f"response_format cannot be enforced: {m.get_error()}")
        return m


def allowed_tokens(m, vocab: int) -> np.ndarray:
    """The matcher's next-token mask as booleans over the vocabulary."""
    bits = np.frombuffer(m.compute_bitmask(), dtype=np.uint8)
    mask = np.unpackbits(bits, bitorder="little").astype(bool)
    if len(mask) < vocab:
        mask = np.concatenate([mask, np.zeros(vocab - len(mask), dtype=bool)])
    return mask[:vocab]


def vllm_kwargs(s, structured_cls=None) -> dict:
    """The vLLM SamplingParams arguments for the adjustments and the response_format
    (structured_cls: vllm.sampling_params.StructuredOutputsParams)."""
    kw: dict = {}
    if s.logit_bias:
        kw["logit_bias"] = {int(t): float(b) for t, b in s.logit_bias.items()}
    if s.presence_penalty:
        kw["presence_penalty"] = s.presence_penalty
    if s.frequency_penalty:
        kw["frequency_penalty"] = s.frequency_penalty
    if s.min_p:
        kw["min_p"] = s.min_p
    if s.response_format is not None:
        kind, schema = s.response_format
        if kind == "json_object":
            kw["structured_outputs"] = structured_cls(json_object=True)
        else:
            kw["structured_outputs"] = structured_cls(json=bounded_integers(json.loads(schema)))
    return kw
