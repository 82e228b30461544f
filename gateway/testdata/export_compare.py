"""Compares a merged export with PEFT's base + adapter (gateway/export_test.go).

usage: export_compare.py BASE_DIR PEFT_DIR MERGED_DIR

Loads the base model and the exported adapter with transformers + PEFT, and the merged
folder with transformers alone, all offline in float32; feeds both the same token ids (fixed
seed) and prints {"max_abs_diff": ..., "max_abs_logit": ...} as JSON. Exits 1 when the
logits differ by more than 1e-4.
"""

import json
import sys

import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

base_dir, peft_dir, merged_dir = sys.argv[1:4]
torch.manual_seed(0)

base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32, local_files_only=True)
vocab = base.config.vocab_size
ids = torch.randint(0, vocab, (2, 24))
with torch.no_grad():
    peft_model = PeftModel.from_pretrained(base, peft_dir)
    peft_model.eval()
    want = peft_model(input_ids=ids).logits
    merged = AutoModelForCausalLM.from_pretrained(merged_dir, dtype=torch.float32, local_files_only=True)
    merged.eval()
    got = merged(input_ids=ids).logits
    plain = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32, local_files_only=True)(input_ids=ids).logits

# The tokenizer files came along: the merged folder's tokenizer loads and encodes.
tok = AutoTokenizer.from_pretrained(merged_dir, local_files_only=True)
assert len(tok("hello world")["input_ids"]) > 0

out = {
    "max_abs_diff": float((want - got).abs().max()),
    "max_abs_logit": float(want.abs().max()),
    # How far the adapter moves the logits: the comparison means something only when it does.
    "adapter_effect": float((want - plain).abs().max()),
}
print(json.dumps(out))
sys.exit(0 if out["max_abs_diff"] <= 1e-4 else 1)
