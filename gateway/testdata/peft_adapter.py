"""Writes a PEFT LoRA adapter trained "elsewhere" and PEFT's own answers for it
(gateway/import_test.go).

usage: peft_adapter.py BASE_DIR OUT_DIR PROMPT_IDS_JSON MAX_NEW

Builds a LoRA adapter on the base model with PEFT from a fixed seed (random A and B, so it
changes the outputs; r=4, lora_alpha=8, q/v/down projections), saves it into OUT_DIR, and
prints as JSON the greedy continuation of the prompt (token ids, stopping at the model's
EOS), and the log-probabilities PEFT gives every token of prompt + continuation after its
prefix (the first position has none).
"""

import json
import sys

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

base_dir, out_dir, prompt_json, max_new = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
prompt = json.loads(prompt_json)
torch.manual_seed(1234)

base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32, local_files_only=True)
cfg = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj", "down_proj"],
                 init_lora_weights=False)
model = get_peft_model(base, cfg)
model.eval()
with torch.no_grad():
    # init_lora_weights=False draws B too; scale B up so the adapter visibly moves the logits.
    for name, p in model.named_parameters():
        if "lora_B" in name:
            p.mul_(20.0)
model.save_pretrained(out_dir)

eos = base.config.eos_token_id
eos = set(eos if isinstance(eos, list) else [eos])
ids = list(prompt)
with torch.no_grad():
    for _ in range(max_new):
        logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
        nxt = int(torch.argmax(logits))
        ids.append(nxt)
        if nxt in eos:
            break
    lp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].double(), dim=-1)
prompt_logprobs = [None] + [float(lp[i - 1, ids[i]]) for i in range(1, len(ids))]
print(json.dumps({"generated": ids[len(prompt):], "sequence": ids, "prompt_logprobs": prompt_logprobs}))
