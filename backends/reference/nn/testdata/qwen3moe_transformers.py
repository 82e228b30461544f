"""Qwen3-MoE parity fixtures for the reference engine (moe_test.go).

make OUT: writes OUT/model (a tiny random Qwen3MoeForCausalLM, float32, fixed seed: hidden
64, 3 layers of which layer 1 is a dense MLP (mlp_only_layers), 4 experts, top-2,
norm_topk_prob; norms randomised) and OUT/adapter (a PEFT LoRA on q,k,v,o and on every
expert's gate_up_proj and down_proj through target_parameters, rank 4 per expert, random A
and B), and prints JSON: tokens, targets, base and adapted log-probs (float64 and float32)
and the float64 gradients of −Σ log-probs w.r.t. the LoRA weights.
score MODEL ADAPTER TOKENS TARGETS: prints the adapter's float64 log-probs (PEFT).
init SEED RANK JSON: prints the torch worker's initial lora_A (loops_worker.lora.init_lora_a)
for each [name, rows, fan_in] of JSON, so that both engines start an adapter alike.
"""
import os
import json
import sys

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM, Qwen3MoeConfig

ATTN = ["q_proj", "k_proj", "v_proj", "o_proj"]
EXPERTS = ["gate_up_proj", "down_proj"]


def load(model_dir, dtype):
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation="eager",
                                                experts_implementation="eager")


def logprobs(model, toks, tgts):
    logits = model(torch.tensor([toks])).logits[0]
    lp = torch.log_softmax(logits, dim=-1)
    return lp.gather(1, torch.tensor(tgts)[:, None])[:, 0]


def make(out):
    torch.manual_seed(27)
    cfg = Qwen3MoeConfig(
        vocab_size=96, hidden_size=64, intermediate_size=48, moe_intermediate_size=40,
        num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        num_experts=4, num_experts_per_tok=2, norm_topk_prob=True, mlp_only_layers=[1],
        max_position_embeddings=64, rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=False)
    cfg.architectures = ["Qwen3MoeForCausalLM"]
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, experts_implementation="eager")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(1, 0.3)
            else:
                p.normal_(0, 0.2)
    model.save_pretrained(f"{out}/model")
    toks = torch.randint(0, 96, (14,)).tolist()
    tgts = torch.randint(0, 96, (14,)).tolist()
    model = load(f"{out}/model", torch.float32)
    peft = get_peft_model(model, LoraConfig(r=4, lora_alpha=32, lora_dropout=0.0, target_modules=ATTN,
                                            target_parameters=EXPERTS))
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "lora_" in name:
                p.normal_(0, 0.15)
    peft.save_pretrained(f"{out}/adapter")
    res = {"tokens": toks, "targets": tgts}
    with torch.no_grad():
        res["lora32"] = logprobs(peft, toks, tgts).tolist()
    base = load(f"{out}/model", torch.float64)
    with torch.no_grad():
        res["base64"] = logprobs(base, toks, tgts).tolist()
    peft = PeftModel.from_pretrained(base, f"{out}/adapter", is_trainable=True)
    lp = logprobs(peft, toks, tgts)
    res["lora64"] = lp.tolist()
    (-lp.sum()).backward()
    res["grads"] = {n.replace(".default", ""): p.grad.flatten().tolist()
                    for n, p in peft.named_parameters() if "lora_" in n}
    print(json.dumps(res))


def score(model_dir, adapter_dir, toks, tgts):
    peft = PeftModel.from_pretrained(load(model_dir, torch.float64), adapter_dir)
    with torch.no_grad():
        print(json.dumps(logprobs(peft, json.loads(toks), json.loads(tgts)).tolist()))


def init(seed, rank, specs):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../../torch"))
    from loops_worker.lora import init_lora_a
    print(json.dumps({n: init_lora_a(n, int(seed), rows, fan_in).flatten().tolist()
                      for n, rows, fan_in in json.loads(specs)}))


if __name__ == "__main__":
    {"make": make, "score": score, "init": init}[sys.argv[1]](*sys.argv[2:])
