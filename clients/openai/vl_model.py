"""Writes a tiny random Qwen3-VL (seed 7) to OUT for vision.py: loops/tiny's tokenizer with
Qwen-VL's image tokens added (<|vision_start|> 512, <|vision_end|> 513, <|image_pad|> 514,
<|video_pad|> 515) and Qwen2-VL's chat template (compat/internal/infer/testdata/qwen2_vl.jinja),
and a Qwen2-VL image processor (patch 4, merge 2: a 24×16 image is 6 tokens).

    python vl_model.py OUT   (the torch worker's venv: torch, transformers, Pillow)

loops/tiny's files are read from the Hugging Face cache, where `loops serve` registers them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from huggingface_hub import snapshot_download
from transformers import AutoConfig, AutoModelForImageTextToText
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

ROOT = Path(__file__).resolve().parents[2]
TOKENS = {"<|vision_start|>": 512, "<|vision_end|>": 513, "<|image_pad|>": 514, "<|video_pad|>": 515}


def main(out: Path) -> None:
    tiny = Path(snapshot_download("loops/tiny", local_files_only=True))
    ids = dict(image_token_id=514, video_token_id=515, vision_start_token_id=512, vision_end_token_id=513)
    text = dict(vocab_size=516, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, max_position_embeddings=512, tie_word_embeddings=False, eos_token_id=2,
                rope_parameters=dict(rope_type="default", rope_theta=10000.0, mrope_section=[4, 2, 2], mrope_interleaved=True))
    vision = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, patch_size=4,
                  temporal_patch_size=2, spatial_merge_size=2, num_position_embeddings=16, deepstack_visual_indexes=[0])
    cfg = AutoConfig.for_model("qwen3_vl", text_config=text, vision_config=vision, tie_word_embeddings=False, **ids)
    torch.manual_seed(7)
    AutoModelForImageTextToText.from_config(cfg, dtype=torch.float32).save_pretrained(out)
    Qwen2VLImageProcessorPil(patch_size=4, temporal_patch_size=2, merge_size=2,
                             size={"shortest_edge": 64, "longest_edge": 4096}).save_pretrained(out)
    tok = json.loads((tiny / "tokenizer.json").read_text())
    for content, i in TOKENS.items():
        tok["added_tokens"].append({"id": i, "content": content, "single_word": False, "lstrip": False,
                                    "rstrip": False, "normalized": False, "special": True})
    (out / "tokenizer.json").write_text(json.dumps(tok))
    tc = json.loads((tiny / "tokenizer_config.json").read_text())
    for content, i in TOKENS.items():
        tc.setdefault("added_tokens_decoder", {})[str(i)] = {"content": content, "lstrip": False, "normalized": False,
                                                             "rstrip": False, "single_word": False, "special": True}
    tc["chat_template"] = (ROOT / "compat/internal/infer/testdata/qwen2_vl.jinja").read_text()
    (out / "tokenizer_config.json").write_text(json.dumps(tc))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
