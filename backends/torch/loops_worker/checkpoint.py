"""The shared PEFT-compatible adapter folder format (see backends/reference/nn/checkpoint.go).

adapter_config.json: peft_type LORA, task_type CAUSAL_LM, r, lora_alpha, target_modules,
bias none, base_model_name_or_path. adapter_model.safetensors: F32, PEFT keys
base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight [r, in] / lora_B.weight
[out, r], metadata loops.seed. optimizer.safetensors (training checkpoints): <key>.exp_avg,
<key>.exp_avg_sq, metadata step.
"""

from __future__ import annotations

import json
import os
from typing import Dict, Tuple

import torch
from safetensors import safe_open
from safetensors.torch import save_file

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
OPTIMIZER = "optimizer.safetensors"


def peft_config(rank: int, alpha: float, target_modules, base_model: str) -> dict:
    # Field order and values as the reference engine writes them.
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": rank,
        "lora_alpha": alpha,
        "lora_dropout": 0,
        "target_modules": list(target_modules),
        "bias": "none",
        "base_model_name_or_path": base_model,
        "fan_in_fan_out": False,
        "inference_mode": True,
        "use_rslora": False,
        "use_dora": False,
        "init_lora_weights": True,
        "modules_to_save": None,
        "layers_to_transform": None,
    }


def save(dir_: str, adapter, base_model: str, with_optimizer: bool) -> int:
    os.makedirs(dir_, exist_ok=True)
    alpha = adapter.scale * adapter.spec.rank
    if abs(alpha - 32.0) < 1e-9:
        alpha = 32
    cfg = json.dumps(peft_config(adapter.spec.rank, alpha, adapter.spec.target_modules(), base_model), indent=2) + "\n"
    with open(os.path.join(dir_, ADAPTER_CONFIG), "w") as f:
        f.write(cfg)
    total = len(cfg.encode())
    ws = {k: p.detach().to("cpu", torch.float32).contiguous() for k, p in adapter.params.items()}
    path = os.path.join(dir_, ADAPTER_WEIGHTS)
    save_file(ws, path, metadata={"format": "pt", "loops.seed": str(adapter.spec.seed)})
    total += os.path.getsize(path)
    if with_optimizer:
        os_: Dict[str, torch.Tensor] = {}
        for k in adapter.params:
            os_[k + ".exp_avg"] = adapter.exp_avg[k].detach().to("cpu", torch.float32).contiguous()
            os_[k + ".exp_avg_sq"] = adapter.exp_avg_sq[k].detach().to("cpu", torch.float32).contiguous()
        path = os.path.join(dir_, OPTIMIZER)
        save_file(os_, path, metadata={"format": "pt", "step": str(adapter.step), "optimizer": "adamw"})
        total += os.path.getsize(path)
    return total


def read_config(dir_: str) -> dict:
    with open(os.path.join(dir_, ADAPTER_CONFIG)) as f:
        c = json.load(f)
    if c.get("peft_type") not in (None, "", "LORA"):
        raise ValueError(f"{ADAPTER_CONFIG}: peft_type {c.get('peft_type')!r} is not LORA")
    if int(c.get("r") or 0) < 1:
        raise ValueError(f"{ADAPTER_CONFIG}: r must be at least 1")
    if c.get("use_dora") or c.get("use_rslora"):
        raise ValueError(f"{ADAPTER_CONFIG}: DoRA and rsLoRA adapters are not supported")
    return c


def read_weights(dir_: str) -> Tuple[Dict[str, torch.Tensor], Dict[str, str]]:
    """Tensors (as float32, with PEFT's '.default' adapter name removed) and metadata."""
    out: Dict[str, torch.Tensor] = {}
    with safe_open(os.path.join(dir_, ADAPTER_WEIGHTS), framework="pt") as f:
        meta = f.metadata() or {}
        for k in f.keys():
            out[k.replace(".default.weight", ".weight", 1)] = f.get_tensor(k).to(torch.float32)
    return out, meta


def read_optimizer(dir_: str) -> Tuple[Dict[str, torch.Tensor], int]:
    path = os.path.join(dir_, OPTIMIZER)
    if not os.path.exists(path):
        raise FileNotFoundError(f"optimizer state requested but {OPTIMIZER} could not be read: {path} does not exist")
    out: Dict[str, torch.Tensor] = {}
    with safe_open(path, framework="pt") as f:
        meta = f.metadata() or {}
        for k in f.keys():
            out[k] = f.get_tensor(k).to(torch.float32)
    if "step" not in meta:
        raise ValueError(f"{OPTIMIZER}: missing step in metadata")
    return out, int(meta["step"])
