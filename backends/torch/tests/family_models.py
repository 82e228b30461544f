"""Tiny random models of every family the torch worker serves, written from a fixed seed:
the float64 parity test (test_families.py) and the tinker SDK smoke
(tests/cookbook/test_torch_families.py) build them from here. Each config exercises what is
particular to its family. No loops_worker import: the cookbook venv imports this too."""

import json
import os

import torch

COMMON = dict(vocab_size=320, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              head_dim=16, max_position_embeddings=256, eos_token_id=2, bos_token_id=1, pad_token_id=0)

# family -> (model_type, config overrides): each exercises what is particular to the family
CONFIGS = {
    "qwen3": ("qwen3", dict(intermediate_size=128, tie_word_embeddings=False)),
    "qwen2": ("qwen2", dict(intermediate_size=128, tie_word_embeddings=False)),
    # Llama 3.1's frequency scaling, with an original context short enough to matter
    "llama": ("llama", dict(intermediate_size=128, tie_word_embeddings=False, rope_parameters=dict(
        rope_type="llama3", rope_theta=10000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
        original_max_position_embeddings=8))),
    # a sliding window shorter than the sequences
    "mistral": ("mistral", dict(intermediate_size=128, sliding_window=4, tie_word_embeddings=False)),
    # a sliding window shorter than the sequences, global every 2nd layer, tied embeddings,
    # scaled embeddings (the model's own), final logit soft-capping
    "gemma3": ("gemma3_text", dict(intermediate_size=128, sliding_window=4, layer_types=["sliding_attention", "full_attention"],
                                   tie_word_embeddings=True, final_logit_softcapping=30.0, query_pre_attn_scalar=16)),
    # 4 experts, top 2; layer 1 is a dense MLP layer (mlp_only_layers)
    "qwen3_moe": ("qwen3_moe", dict(intermediate_size=96, moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2,
                                    norm_topk_prob=True, mlp_only_layers=[1], tie_word_embeddings=False)),
    "gpt_oss": ("gpt_oss", dict(intermediate_size=32, num_local_experts=4, num_experts_per_tok=2, sliding_window=4,
                                rope_parameters=dict(rope_type="yarn", rope_theta=150000.0, factor=2.0, beta_fast=32.0,
                                                     beta_slow=1.0, original_max_position_embeddings=128),
                                layer_types=["sliding_attention", "full_attention"], tie_word_embeddings=False)),
    # Gated DeltaNet linear attention in layer 0, full (gated) attention in layer 1
    "qwen3_5": ("qwen3_5_text", dict(intermediate_size=128, linear_num_value_heads=4, linear_num_key_heads=2,
                                     linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4,
                                     layer_types=["linear_attention", "full_attention"], tie_word_embeddings=False)),
    # MLA with a query LoRA, a dense layer 0 (first_k_dense_replace), routed + shared experts in
    # layer 1; Kimi K2's shape in miniature (one expert group, top-k of many small experts)
    "deepseek_v3": ("deepseek_v3", dict(intermediate_size=128, moe_intermediate_size=32, n_routed_experts=4,
                                        n_shared_experts=1, num_experts_per_tok=2, n_group=1, topk_group=1,
                                        first_k_dense_replace=1, q_lora_rank=32, kv_lora_rank=16, qk_rope_head_dim=8,
                                        qk_nope_head_dim=8, v_head_dim=16, num_key_value_heads=4, head_dim=8,
                                        tie_word_embeddings=False)),
    "qwen3_5_moe": ("qwen3_5_moe_text", dict(moe_intermediate_size=32, shared_expert_intermediate_size=32, num_experts=4,
                                             num_experts_per_tok=2, linear_num_value_heads=4, linear_num_key_heads=2,
                                             linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4,
                                             layer_types=["linear_attention", "full_attention"], tie_word_embeddings=False)),
    # MLA + the DSA indexer (top-k keys: fewer than the sequence, so it selects), dense layer 0
    "glm_moe_dsa": ("glm_moe_dsa", dict(intermediate_size=128, moe_intermediate_size=32, n_routed_experts=4,
                                        n_shared_experts=1, num_experts_per_tok=2, n_group=1, topk_group=1,
                                        first_k_dense_replace=1, q_lora_rank=32, kv_lora_rank=16, qk_rope_head_dim=8,
                                        qk_nope_head_dim=8, v_head_dim=16, num_key_value_heads=4, head_dim=8,
                                        index_topk=6, tie_word_embeddings=False)),
    "minimax_m2": ("minimax_m2", dict(intermediate_size=32, num_local_experts=4, num_experts_per_tok=2,
                                      tie_word_embeddings=False)),
    # Mamba-2, attention, MoE: one block of each
    "nemotron_h": ("nemotron_h", dict(hybrid_override_pattern="M*E", num_hidden_layers=3, intermediate_size=128,
                                      n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                      moe_shared_expert_intermediate_size=32, mamba_num_heads=4, mamba_head_dim=16,
                                      ssm_state_size=16, n_groups=1, chunk_size=4, n_group=1, topk_group=1,
                                      tie_word_embeddings=False)),
    # Gemma 4 in miniature: sliding/global layers (global: their own head dim and kv heads, keys
    # reused as values), per-layer embeddings, the last two layers reusing earlier keys/values
    # (double-wide MLP there), a routed-expert block beside the dense MLP, soft-capping, tied
    "gemma4": ("gemma4_text", dict(num_hidden_layers=4, intermediate_size=64, sliding_window=4,
                                   layer_types=["sliding_attention", "full_attention"] * 2, global_head_dim=32,
                                   num_global_key_value_heads=1, attention_k_eq_v=True, num_kv_shared_layers=2,
                                   use_double_wide_mlp=True, hidden_size_per_layer_input=8, vocab_size_per_layer_input=320,
                                   enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=32,
                                   final_logit_softcapping=30.0, tie_word_embeddings=True)),
    # DeepSeek-V4 in miniature: layer 0 heavily compressed (HCA), layer 1 compressed-sparse
    # (CSA, its indexer selecting fewer keys than it has), a sliding window shorter than the
    # sequences, hyper-connections (2 streams), layer 0 hash-routed, shared experts
    "deepseek_v4": ("deepseek_v4", dict(moe_intermediate_size=32, n_routed_experts=4, n_shared_experts=1,
                                        num_experts_per_tok=2, num_key_value_heads=1, q_lora_rank=32, o_groups=2,
                                        o_lora_rank=16, index_n_heads=2, index_head_dim=16, index_topk=2,
                                        sliding_window=4, hc_mult=2, hc_sinkhorn_iters=4, num_nextn_predict_layers=0,
                                        layer_types=["heavily_compressed_attention", "compressed_sparse_attention"],
                                        compress_rates={"heavily_compressed_attention": 4, "compressed_sparse_attention": 2},
                                        mlp_layer_types=["hash_moe", "moe"], tie_word_embeddings=False)),
    # Gated DeltaNet in layer 0, gated full attention in layer 1, routed + shared experts
    "qwen3_next": ("qwen3_next", dict(intermediate_size=64, moe_intermediate_size=32, shared_expert_intermediate_size=32,
                                      num_experts=4, num_experts_per_tok=2, linear_num_value_heads=4,
                                      linear_num_key_heads=2, linear_key_head_dim=16, linear_value_head_dim=16,
                                      linear_conv_kernel_dim=4, layer_types=["linear_attention", "full_attention"],
                                      tie_word_embeddings=False)),
}
# vision-language checkpoints (config.json with text_config and vision_config, saved from the
# full …ForConditionalGeneration): case -> (model_type, family, text config overrides, tied).
# The worker serves their language model on text; PEFT runs on the full VL model.
VISION = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, patch_size=4,
              temporal_patch_size=1, spatial_merge_size=1)
VL_CONFIGS = {
    # Qwen/Qwen3.5-4B's packaging (the tinker-cookbook's default model): tied embeddings
    "qwen3_5_vl": ("qwen3_5", "qwen3_5", CONFIGS["qwen3_5"][1], True),
    "qwen3_5_moe_vl": ("qwen3_5_moe", "qwen3_5_moe", CONFIGS["qwen3_5_moe"][1], False),
    # google/gemma-3-4b-it's packaging (keys language_model.model.*, a SigLIP tower whose
    # q/k/v_proj PEFT's target names also match); no soft-capping (the VL model applies none)
    "gemma3_vl": ("gemma3", "gemma3", {k: v for k, v in CONFIGS["gemma3"][1].items() if k != "final_logit_softcapping"}, True),
    # google/gemma-4-26B-A4B-it's packaging (Gemma4ForConditionalGeneration, no audio tower)
    "gemma4_vl": ("gemma4", "gemma4", CONFIGS["gemma4"][1], True),
    # moonshotai/Kimi-K2.5's packaging: a MoonViT tower before a DeepSeek-V3 language model
    "kimi_k25": ("kimi_k25", "kimi_k25", {**CONFIGS["deepseek_v3"][1], "model_type": "deepseek_v3"}, False),
}
VISION_OF = {"gemma3": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                            image_size=16, patch_size=4),
             "gemma4": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                            num_key_value_heads=2, head_dim=16, patch_size=4, position_embedding_size=64),
             "kimi_k25": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                              patch_size=4, pos_emb_height=8, pos_emb_width=8, pos_emb_time=2)}
# a Kimi K2 checkpoint (model_type kimi_k2, remote code): the deepseek_v3 miniature with
# Kimi K2's config.json (REMOTE_CODE), read by the worker as deepseek_v3's config
CONFIGS["kimi_k2"] = ("deepseek_v3", CONFIGS["deepseek_v3"][1])
# what a Kimi K2 config.json says beyond DeepSeek-V3's fields (moonshotai/Kimi-K2-Instruct's)
REMOTE_CODE = {"kimi_k2": dict(model_type="kimi_k2", architectures=["DeepseekV3ForCausalLM"], scoring_func="sigmoid",
                               topk_method="noaux_tc", moe_layer_freq=1, ep_size=1, aux_loss_alpha=0.001, seq_aux=True,
                               auto_map={"AutoConfig": "configuration_deepseek.DeepseekV3Config",
                                         "AutoModelForCausalLM": "modeling_deepseek.DeepseekV3ForCausalLM"})}
FAMILY_OF = {**{k: k for k in CONFIGS}, **{k: v[1] for k, v in VL_CONFIGS.items()}}


def build(family, d, **common):
    """Writes family's tiny model (a CONFIGS or VL_CONFIGS case) to folder d; common overrides
    COMMON (e.g. the vocabulary of a tokenizer copied in beside it). Returns str(d)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    def sized(kw):  # Gemma 4's per-layer embeddings have the vocabulary of the token embedding
        vocab = {**COMMON, **common}["vocab_size"]
        return {**kw, "vocab_size_per_layer_input": vocab} if "vocab_size_per_layer_input" in kw else kw

    if family in VL_CONFIGS:
        mt, _, kw, tied = VL_CONFIGS[family]
        text = {**COMMON, **common, **sized(kw), "tie_word_embeddings": tied}
        extra = {"mm_tokens_per_image": 4} if mt == "gemma3" else {}
        cfg = AutoConfig.for_model(mt, text_config=text, vision_config=VISION_OF.get(mt, VISION), tie_word_embeddings=tied, **extra)
        torch.manual_seed(1234)
        m = AutoModelForImageTextToText.from_config(cfg)
    else:
        mt, kw = CONFIGS[family]
        cfg = AutoConfig.for_model(mt, **{**COMMON, **common, **sized(kw)})
        torch.manual_seed(1234)
        m = AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():  # MoE experts are created empty; give every parameter a seeded value
        g = torch.Generator().manual_seed(99)
        for n, p in m.named_parameters():
            if p.dim() == 3 or "bias" in n or "sinks" in n or "A_log" in n or "gate.weight" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    m.save_pretrained(str(d))
    if family in REMOTE_CODE:
        with open(os.path.join(d, "config.json")) as f:
            raw = json.load(f)
        raw.update(REMOTE_CODE[family])
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(raw, f)
    return str(d)
