"""Checks Loops' embeddings against transformers (compat/openai/embeddings_test.go).

usage: embed_compare.py MODEL_DIR < {"inputs": [[ids...], ...], "embeddings": [[floats...], ...]}

Loads the model folder with transformers offline in float32 and, per input, takes the mean
over its tokens of the last hidden state (hidden_states[-1], which transformers returns
after the model's final norm), then prints {"max_abs_diff": ..., "hidden_size": ...} as
JSON. Exits 1 when an embedding differs by more than 1e-5.
"""

import json
import sys

import torch
from transformers import AutoModelForCausalLM

model_dir = sys.argv[1]
data = json.load(sys.stdin)
model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, local_files_only=True)
model.eval()
worst = 0.0
with torch.no_grad():
    for ids, got in zip(data["inputs"], data["embeddings"], strict=True):
        x = torch.tensor([ids])
        out = model(input_ids=x, output_hidden_states=True)
        last = out.hidden_states[-1]
        # the decoder's own last_hidden_state is after the final norm: hidden_states[-1] is it
        assert torch.equal(last, model.model(input_ids=x).last_hidden_state), "hidden_states[-1] is not post-norm"
        want = last[0].to(torch.float64).mean(dim=0)
        diff = (want - torch.tensor(got, dtype=torch.float64)).abs().max().item()
        worst = max(worst, diff)
print(json.dumps({"max_abs_diff": worst, "hidden_size": model.config.hidden_size}))
sys.exit(0 if worst <= 1e-5 else 1)
