"""The renderer the catalog names for each family (ModelInfo.renderer, `renderer_name` in
get_server_capabilities: loops_worker/families/) is the tinker-cookbook 0.6.1 renderer that
fits the family's tokenizer: on a tiny tokenizer with the family's special tokens (as its
published tokenizer has them, written by this test: byte-level, no merges), the renderer's
generation prompt starts its supervised example of the same conversation (up to a thinking
opener), its chat markers and stop tokens are special tokens of that tokenizer, and
parse_response of the tokens after the prompt gives the assistant message back."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")
from tinker_cookbook import renderers  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "backends" / "torch"))
from loops_worker.families import FAMILIES  # noqa: E402 - stdlib only

# The special tokens of each family's published tokenizer (its chat markers, bos/eos, thinking
# tags), and which of them are bos/eos. Written from the tokenizers on the hub, not from the
# renderers: a renderer that does not fit would encode its markers as plain bytes.
QWEN = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "</tool_call>",
        "<|vision_start|>", "<|vision_end|>", "<|image_pad|>"]
DEEPSEEK = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "<think>", "</think>",
            "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>",
            "<｜tool▁sep｜>"]
KIMI = ["[BOS]", "[EOS]", "<|im_end|>", "<|im_user|>", "<|im_assistant|>", "<|im_system|>", "<|im_middle|>",
        "<think>", "</think>", "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>",
        "<|tool_call_argument_begin|>", "<|tool_call_end|>", "<|media_begin|>", "<|media_content|>", "<|media_end|>"]
GEMMA = ["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>"]
SPECIALS = {  # family -> (special tokens, bos, eos)
    "qwen3": (QWEN, None, "<|im_end|>"),
    "qwen2": (QWEN, None, "<|endoftext|>"),
    "qwen3_5": (QWEN, None, "<|im_end|>"),
    "qwen3_moe": (QWEN, None, "<|im_end|>"),
    "qwen3_5_moe": (QWEN, None, "<|im_end|>"),
    "qwen3_next": (QWEN, None, "<|im_end|>"),
    "qwen3_vl": (QWEN, None, "<|im_end|>"),  # a text conversation; with an image: test_torch_vision.py
    "llama": (["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
               "<|eom_id|>", "<|python_tag|>"], "<|begin_of_text|>", "<|eot_id|>"),
    "mistral": (["<unk>", "<s>", "</s>", "[INST]", "[/INST]"], "<s>", "</s>"),
    "gemma3": (GEMMA, "<bos>", "<eos>"),
    "gemma4": (GEMMA, "<bos>", "<eos>"),
    "gpt_oss": (["<|startoftext|>", "<|endoftext|>", "<|start|>", "<|end|>", "<|message|>", "<|channel|>",
                 "<|constrain|>", "<|return|>", "<|call|>"], "<|startoftext|>", "<|return|>"),
    "deepseek_v3": (DEEPSEEK, "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    "deepseek_v4": (DEEPSEEK + ["<｜System｜>"], "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    "kimi_k2": (KIMI, "[BOS]", "[EOS]"),
    "kimi_k25": (KIMI, "[BOS]", "[EOS]"),
    "glm_moe_dsa": (["<|endoftext|>", "[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>",
                     "<|observation|>", "<think>", "</think>"], None, "<|endoftext|>"),
    "minimax_m2": (["]~!b[", "]~b]", "[e~[", "<think>", "</think>"], "]~!b[", "[e~["),
    "nemotron_h": (["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"], "<s>", "<|im_end|>"),
}
CONVO = [{"role": "user", "content": "What is 2+2? Answer briefly."}, {"role": "assistant", "content": "It is 4."}]


def tiny_tokenizer(specials, bos, eos):
    """A byte-level BPE tokenizer (256 byte symbols, no merges) with the given special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {c: i for i, c in enumerate(sorted(alphabet))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(specials)
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=bos, eos_token=eos,
                                                name_or_path="loops-tiny-renderer-test")


def _text(msg) -> str:
    c = msg["content"]
    if isinstance(c, str):
        return c
    return "".join(p["text"] for p in c if p.get("type") == "text")


@pytest.mark.parametrize("family", [f.name for f in FAMILIES])
def test_catalog_renderer_round_trips(family):
    fam = {f.name: f for f in FAMILIES}[family]
    specials, bos, eos = SPECIALS[family]
    tok = tiny_tokenizer(specials, bos, eos)
    special_ids = {tok.convert_tokens_to_ids(s) for s in specials}
    r = renderers.get_renderer(fam.renderer, tok)

    prompt = r.build_generation_prompt(CONVO[:1]).to_ints()
    model_input, weights = r.build_supervised_example(CONVO)
    full = model_input.to_ints()
    w = [float(x) for x in weights.tolist()]
    # the trained conversation starts with the generation prompt; a thinking renderer's prompt
    # may end in the opener of its reasoning (<think> and a newline) where the trained reply
    # closes an empty one (<think></think>): they differ in at most those last two tokens
    k = next((i for i, (a, b) in enumerate(zip(prompt, full)) if a != b), min(len(prompt), len(full)))
    assert k >= len(prompt) - 2, (family, fam.renderer, tok.decode(prompt), tok.decode(full))
    assert any(w[k:]) and not any(w[: len(prompt) - 2]), "only the assistant's reply is trained"

    # the renderer's chat markers are the family's special tokens, not byte strings
    if fam.renderer != "role_colon":
        assert special_ids & set(prompt), (family, fam.renderer, tok.decode(prompt))
    stops = r.get_stop_sequences()
    for s in stops:
        if isinstance(s, int):
            assert s in special_ids, (family, fam.renderer, s, tok.convert_ids_to_tokens(s))

    # what the model generates after the prompt's common part, parsed, is the assistant's message
    response = full[k:]
    msg, ok = r.parse_response(response)
    assert ok, (family, fam.renderer, tok.decode(response))
    assert msg["role"] == "assistant" and _text(msg).strip() == CONVO[1]["content"], (family, msg)
