"""tinker-cookbook 0.6.1's weights tools on Loops checkpoints (issue 39; see README.md).

Per family Loops serves (loops/tiny with tied embeddings; Qwen3, Qwen2 and Llama with untied
ones, tiny random models written here from a fixed seed): train a few steps with the tinker
SDK, download the checkpoint with the tinker 0.38 CLI (`tinker checkpoint download`), run
`build_hf_model` (float32, merge strategies "shard" and "full") and `build_lora_adapter`
unchanged (Gemma 3, tied, on the torch worker when its venv is there), and compare the merged model's and the PEFT adapter's log-probs (transformers +
PEFT, float32) with the server's. `publish_to_hf_hub` runs up to its upload, against a
recording HfApi. The other way: an adapter written by hand in Tinker's layout is imported
with `loops checkpoints import` and samples as PEFT does.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")
import tinker  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from tinker import types  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "tests"))
from loops_server import loops_binary, running_server  # noqa: E402

API_KEY = "tml-cookbook"
TOL = 1e-4
RANK = 4
# The sequence whose log-probs are compared (byte-level tokens of loops/tiny's tokenizer).
SEQ = [72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100, 33, 32, 76, 111, 111, 112, 115]
TRAIN = [[84, 104, 101, 32, 99, 97, 116, 32, 115, 97, 116], [76, 111, 111, 112, 115, 32, 114, 117, 110, 115]]

# (family, LoRA flags) cells; loops/tiny is tied, the others untied.
CELLS = [
    ("tiny", dict(train_attn=True, train_mlp=True, train_unembed=False)),
    ("tiny", dict(train_attn=True, train_mlp=True, train_unembed=True)),
    ("tiny", dict(train_attn=False, train_mlp=True, train_unembed=True)),
    ("tiny", dict(train_attn=True, train_mlp=False, train_unembed=True)),
    ("qwen3", dict(train_attn=True, train_mlp=True, train_unembed=True)),
    ("qwen3", dict(train_attn=True, train_mlp=True, train_unembed=False)),
    ("qwen2", dict(train_attn=True, train_mlp=False, train_unembed=True)),
    ("llama", dict(train_attn=False, train_mlp=True, train_unembed=True)),
    ("gemma3", dict(train_attn=True, train_mlp=True, train_unembed=False)),
    ("gemma3", dict(train_attn=True, train_mlp=True, train_unembed=True)),
    ("qwen3_moe", dict(train_attn=True, train_mlp=True, train_unembed=True)),
    ("qwen3_5", dict(train_attn=True, train_mlp=True, train_unembed=True)),
    ("gpt_oss", dict(train_attn=True, train_mlp=True, train_unembed=True)),
]
TIED = {"tiny", "gemma3"}
# Families the torch worker serves (one `loops serve --backend torch` of them all).
TORCH = ("gemma3", "qwen3_moe", "qwen3_5", "gpt_oss")
# MoE families: the download holds Tinker's 3-D expert LoRA (experts.w1/w2/w3).
MOE = {"qwen3_moe", "gpt_oss"}
TABLE: list[dict] = []


def _random_model(kind: str, out: Path, tiny_dir: Path) -> None:
    """A tiny random model of a family, float32, written with transformers from a fixed seed."""
    from transformers import (AutoConfig, AutoModelForCausalLM, Gemma3TextConfig, LlamaConfig, Qwen2Config,
                              Qwen3Config, Qwen3MoeConfig)

    vocab = json.loads((tiny_dir / "config.json").read_text())["vocab_size"]
    common = dict(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                  rms_norm_eps=1e-6, tie_word_embeddings=False, initializer_range=0.1,
                  rope_theta=10000.0, hidden_act="silu")
    gemma = {k: v for k, v in common.items() if k not in ("tie_word_embeddings", "hidden_act")}
    cfg = {"qwen3": lambda: Qwen3Config(head_dim=16, **common),
           "qwen2": lambda: Qwen2Config(**common),
           "llama": lambda: LlamaConfig(head_dim=16, **common),
           # Gemma 3 (text): tied, embeddings scaled by sqrt(hidden), sliding and full layers.
           # Qwen3-MoE: 4 experts of intermediate 48, top 2 (the experts are fused 3-D
           # parameters in transformers 5, saved per expert). Not 32: with hidden = 2 ×
           # moe_intermediate_size the cookbook's "full" merge cannot tell which axis of
           # gate_up_proj is fused (_detect_fused_axis tries the last first) and misplaces
           # the update (docs/export-import.md); no released Qwen3-MoE has that shape.
           "qwen3_moe": lambda: Qwen3MoeConfig(head_dim=16, moe_intermediate_size=48, num_experts=4,
                                               num_experts_per_tok=2, **common),
           # Qwen3.5 (text): a Gated DeltaNet layer (in_proj_qkv fused) and a full attention one
           "qwen3_5": lambda: AutoConfig.for_model(
               "qwen3_5_text", head_dim=16, linear_num_value_heads=4, linear_num_key_heads=2,
               linear_key_head_dim=16, linear_value_head_dim=16,
               layer_types=["linear_attention", "full_attention"], **common),
           # gpt-oss: experts stored transposed, gate/up interleaved; sliding and full layers
           "gpt_oss": lambda: AutoConfig.for_model(
               "gpt_oss", head_dim=16, num_local_experts=4, num_experts_per_tok=2, sliding_window=64,
               rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
               layer_types=["sliding_attention", "full_attention"],
               **{k: v for k, v in common.items() if k not in ("intermediate_size", "rope_theta")},
               intermediate_size=48),
           "gemma3": lambda: Gemma3TextConfig(head_dim=16, sliding_window=64, tie_word_embeddings=True,
                                              layer_types=["sliding_attention", "full_attention"], **gemma)}[kind]()
    if kind == "gemma3":
        cfg.architectures = ["Gemma3ForCausalLM"]
    torch.manual_seed({"qwen3": 3, "qwen2": 2, "llama": 1, "gemma3": 4, "qwen3_moe": 6, "qwen3_5": 8, "gpt_oss": 9}[kind])
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():  # fused experts are created uninitialised
        for p in model.parameters():
            if p.dim() == 3:
                p.normal_(0, 0.1)
    model.save_pretrained(out)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(tiny_dir / f, out / f)


@pytest.fixture(scope="module")
def tiny_tokenizer(loops_url) -> Path:  # noqa: ARG001 - the session server registers loops/tiny
    """loops/tiny's tokenizer and config, as `loops serve` registers them in the HF cache."""
    from huggingface_hub import snapshot_download

    return Path(snapshot_download("loops/tiny", local_files_only=True))


@pytest.fixture(scope="module")
def models(tiny_tokenizer, tmp_path_factory) -> dict[str, str]:
    """Served model name per family; the random ones are folders."""
    root = tmp_path_factory.mktemp("models")
    out = {"tiny": "loops/tiny"}
    for kind in ("qwen3", "qwen2", "llama") + TORCH:
        _random_model(kind, root / kind, tiny_tokenizer)
        out[kind] = str(root / kind)
    return out


def _torch_python() -> str | None:
    """The torch worker's interpreter: LOOPS_TORCH_PYTHON, or the venv CI builds for it."""
    venvs = Path(os.environ.get("LOOPS_VENV_DIR") or Path.home() / ".cache/loops/venvs")
    py = os.environ.get("LOOPS_TORCH_PYTHON") or str(venvs / "torch-worker" / "bin" / "python")
    return py if Path(py).exists() else None


@pytest.fixture(scope="module")
def server(models, recipe_env):
    """A `loops serve` of every family; yields it, the environment a user sets, and each
    family's folder, given to the cookbook as base_model (loops/tiny's is the one this server
    writes in its data folder: `base_model="loops/tiny"` works too, from the HF cache, but
    that cache is shared by every server on the machine)."""
    args = []
    for family, m in models.items():
        if family not in TORCH:
            args += ["--model", m]
    with running_server("weights", extra_args=args) as srv:
        env = dict(recipe_env, TINKER_BASE_URL=srv.url)
        os.environ["TINKER_BASE_URL"] = srv.url
        yield srv, env, dict(models, tiny=str(srv.log_path.parent / "data" / "models" / "loops-tiny"))
    os.environ["TINKER_BASE_URL"] = recipe_env["TINKER_BASE_URL"]


@pytest.fixture(scope="module")
def torch_server(models, recipe_env):
    """A `loops serve --backend torch` of the families only the torch worker serves (TORCH)."""
    py = _torch_python()
    if py is None:
        pytest.skip("no torch worker venv (LOOPS_TORCH_PYTHON): these families are served by the torch worker")
    # eager attention: the worker asks transformers for sdpa by default, which transformers
    # 5.24 refuses for gpt-oss (GptOssForCausalLM has no sdpa path; attention sinks)
    args = ["--backend", "torch", "--backend-opt", f"python={py}",
            "--backend-opt", f"pythonpath={REPO_ROOT / 'backends' / 'torch'}",
            "--backend-opt", "args=--attn-implementation eager"]
    for family in TORCH:
        args += ["--model", models[family]]
    with running_server("weights-torch", extra_args=args) as srv:
        env = dict(recipe_env, TINKER_BASE_URL=srv.url)
        yield srv, env, dict(models)


def _logprobs(model, seq=SEQ) -> list[float]:
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([seq])).logits[0].double()
    lp = torch.log_softmax(logits, dim=-1)
    return [float(lp[i - 1, seq[i]]) for i in range(1, len(seq))]


def _server_logprobs(sampling_client, seq=SEQ) -> list[float]:
    got = sampling_client.compute_logprobs(types.ModelInput.from_ints(seq)).result()
    assert got[0] is None and len(got) == len(seq)
    return [float(x) for x in got[1:]]


def _train(base: str, flags: dict, name: str):
    sc = tinker.ServiceClient()
    tc = sc.create_lora_training_client(base_model=base, rank=RANK, seed=5, **flags)
    data = [types.Datum(model_input=types.ModelInput.from_ints(s[:-1]),
                        loss_fn_inputs={"target_tokens": s[1:], "weights": [1.0] * (len(s) - 1)})
            for s in TRAIN]
    for _ in range(3):
        tc.forward_backward(data, "cross_entropy").result()
        tc.optim_step(types.AdamParams(learning_rate=2e-2)).result()
    state = tc.save_state(name).result().path
    sampler = tc.save_weights_and_get_sampling_client(name + "-s")
    return state, sampler


def _download(env: dict, path: str, out: Path) -> Path:
    tinker_cli = Path(sys.executable).parent / "tinker"
    proc = subprocess.run([str(tinker_cli), "checkpoint", "download", path, "--output", str(out)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out / path.replace("tinker://", "").replace("/", "_")


def _maxdiff(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b)
    return max(abs(x - y) for x, y in zip(a, b))


@pytest.mark.timeout(900)
@pytest.mark.parametrize("family,flags", CELLS,
                         ids=[f"{f}-" + "-".join(k[6:] for k, v in fl.items() if v) for f, fl in CELLS])
def test_cookbook_weights_tools(request, models, family, flags, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    from tinker_cookbook.weights import build_hf_model, build_lora_adapter

    _, env, dirs = request.getfixturevalue("torch_server" if family in TORCH else "server")
    os.environ["TINKER_BASE_URL"] = env["TINKER_BASE_URL"]
    base = dirs[family]  # what the cookbook is given as base_model
    state, sampler = _train(models[family], flags, f"w-{family}-{len(TABLE)}")
    want = _server_logprobs(sampler)
    base_lp = _logprobs(AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32))
    moved = _maxdiff(want, base_lp)
    assert moved > 1e-2, f"training moved the log-probs by only {moved}"

    adapter = _download(env, state, tmp_path / "dl")
    names = set(load_file(str(adapter / "adapter_model.safetensors")))
    cfg = json.loads((adapter / "adapter_config.json").read_text())
    # Tinker's layout: the unembedding's LoRA is model.unembed_tokens, never PEFT's lm_head.
    assert not any(".lm_head." in n for n in names), names
    assert any(".unembed_tokens." in n for n in names) == flags["train_unembed"]
    assert ("unembed_tokens" in cfg["target_modules"]) == flags["train_unembed"]
    assert any(".self_attn." in n for n in names) == flags["train_attn"]
    assert any(".mlp." in n for n in names) == flags["train_mlp"]
    assert cfg["r"] == RANK and cfg["lora_alpha"] == 32
    if family in MOE:
        # Tinker's expert layout: 3-D (experts, r, in) / (experts, out, r) per projection,
        # w1 gate, w3 up, w2 down; never PEFT's target_parameters keys
        experts = {n for n in names if ".experts." in n}
        assert experts and all(".experts.w" in n for n in experts), experts
        assert {n.split(".experts.")[1].split(".")[0] for n in experts} == {"w1", "w2", "w3"}
        assert "target_parameters" not in cfg and {"w1", "w2", "w3"} <= set(cfg["target_modules"])

    tied = family in TIED
    row = {"family": family + (" (tied)" if tied else ""), "flags": "+".join(k[6:] for k, v in flags.items() if v)}
    for strategy in ("shard", "full"):
        out = tmp_path / f"merged-{strategy}"
        build_hf_model(base_model=base, adapter_path=str(adapter), output_path=str(out), dtype="float32",
                       merge_strategy=strategy)
        row[f"build_hf_model/{strategy}"] = _maxdiff(want, _logprobs(AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)))
    peft_dir = tmp_path / "peft"
    build_lora_adapter(base_model=base, adapter_path=str(adapter), output_path=str(peft_dir))
    pm = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32), str(peft_dir))
    row["build_lora_adapter"] = _maxdiff(want, _logprobs(pm.eval()))
    if family == "gpt_oss":
        # build_lora_adapter writes per-expert keys (experts.<e>.gate_proj/up_proj/down_proj,
        # for vLLM), which PEFT 0.21 does not load into transformers 5's fused GptOssExperts
        # (it adapts attention and the head only): the PEFT column measures that. Checked
        # instead: every expert's B·A in that adapter is the update the exact merged model got
        # (gate_up_proj [E, H, 2I] with gate/up interleaved, down_proj [E, I, H]).
        assert not any("experts" in n and "lora" in n for n, _ in pm.named_parameters())
        row["build_lora_adapter experts vs merged"] = _gpt_oss_expert_diff(peft_dir, base, tmp_path / "merged-full")
        row["build_lora_adapter (PEFT loads no experts)"] = row.pop("build_lora_adapter")
    tied_unembed = tied and flags["train_unembed"]
    if tied_unembed and family != "gemma3":  # the torch worker does not check imports
        # The cookbook writes a tied model's unembedding LoRA as an embed_tokens LoRA with
        # lora_A/lora_B factors, which PEFT does not load for an embedding (it names them
        # lora_embedding_A/B, and the config lacks ensure_weight_tying): PEFT applies the
        # other modules only. Loops' import reads that file as the shared-matrix LoRA it is:
        # imported back, it samples as the server did.
        row["build_lora_adapter → loops import"] = _maxdiff(want, _import_and_score(env, peft_dir, base, family, len(TABLE)))
    TABLE.append(row)
    print(f"\n[weights] {row} (training moved log-probs by {moved:.3g})")
    if os.environ.get("LOOPS_COOKBOOK_REPORT"):
        with open(os.environ["LOOPS_COOKBOOK_REPORT"], "a") as f:
            f.write(json.dumps({"weights": row}) + "\n")

    if tied_unembed:
        # The cookbook folds a tied model's unembedding LoRA into the shared embedding matrix
        # (it maps unembed_tokens to model.embed_tokens), as Loops applies it (the head and
        # the embedding lookup: docs/semantics.md), so the merged models are exact. Checked
        # too: the archive carries exactly the server's LoRA (the tensors of `loops
        # checkpoints export --format peft`, the stored folder, under Tinker's names) and the
        # PEFT export loads in PEFT (ensure_weight_tying) with the server's log-probs.
        for k in ("build_hf_model/shard", "build_hf_model/full", "build_lora_adapter → loops import"):
            assert row.get(k, 0) < TOL, row
        srv_url = env["TINKER_BASE_URL"]
        proc = subprocess.run([str(loops_binary()), "checkpoints", "export", state, "--format", "peft", "-o",
                               str(tmp_path / "peft-export"), "--url", srv_url, "--api-key", API_KEY],
                              env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        stored = load_file(str(tmp_path / "peft-export" / "adapter_model.safetensors"))
        downloaded = load_file(str(adapter / "adapter_model.safetensors"))
        assert {k.replace(".lm_head.", ".model.unembed_tokens.") for k in stored} == set(downloaded)
        for k, v in stored.items():
            assert torch.equal(v, downloaded[k.replace(".lm_head.", ".model.unembed_tokens.")]), k
        assert json.loads((tmp_path / "peft-export" / "adapter_config.json").read_text())["ensure_weight_tying"] is True
        pe = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32),
                                       str(tmp_path / "peft-export"))
        assert _maxdiff(want, _logprobs(pe.eval())) < TOL
        return
    for k in ("build_hf_model/shard", "build_hf_model/full", "build_lora_adapter", "build_lora_adapter experts vs merged"):
        assert row.get(k, 0) < TOL, row


def _gpt_oss_expert_diff(peft_dir: Path, base: str, merged: Path) -> float:
    """Max |Δ| between the per-expert updates of a gpt-oss adapter from build_lora_adapter
    (scale·B·A per expert and projection) and merged − base of the fused expert weights."""
    from transformers import AutoModelForCausalLM

    cfg = json.loads((peft_dir / "adapter_config.json").read_text())
    scale = cfg["lora_alpha"] / cfg["r"]
    w = load_file(str(peft_dir / "adapter_model.safetensors"))
    b = dict(AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).named_parameters())
    m = dict(AutoModelForCausalLM.from_pretrained(merged, dtype=torch.float32).named_parameters())
    worst, n = 0.0, 0
    for name in b:
        if not name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            continue
        diff = (m[name] - b[name]).double()
        pre = "base_model.model." + name.rsplit(".", 1)[0]
        for e in range(diff.shape[0]):
            def delta(proj):
                a, bb = w[f"{pre}.{e}.{proj}.lora_A.weight"].double(), w[f"{pre}.{e}.{proj}.lora_B.weight"].double()
                return (scale * bb @ a).T  # stored as (in, out)
            if name.endswith("gate_up_proj"):
                got = [(diff[e][:, 0::2], delta("gate_proj")), (diff[e][:, 1::2], delta("up_proj"))]
            else:
                got = [(diff[e], delta("down_proj"))]
            for d, want in got:
                worst, n = max(worst, float((d - want).abs().max())), n + 1
    assert n > 0
    return worst


def _import_and_score(env: dict, folder: Path, base: str, family: str, n: int) -> list[float]:
    """Imports an adapter folder with `loops checkpoints import` and returns the server's
    log-probs of SEQ with it."""
    proc = subprocess.run([str(loops_binary()), "checkpoints", "import", str(folder), "--base-model",
                           "loops/tiny" if family == "tiny" else base, "--name", f"cookbook-peft-{n}",
                           "--url", env["TINKER_BASE_URL"], "--api-key", API_KEY],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    path = proc.stdout.split()[1]
    return _server_logprobs(tinker.ServiceClient().create_sampling_client(model_path=path))


def test_publish_to_hf_hub_builds_the_upload(server, models, tmp_path, monkeypatch):
    """publish_to_hf_hub up to its upload: the model card and the folder it would send."""
    from tinker_cookbook.weights import ModelCardConfig, build_lora_adapter, publish_to_hf_hub
    import tinker_cookbook.weights._publish as publish

    _, env, dirs = server
    os.environ["TINKER_BASE_URL"] = env["TINKER_BASE_URL"]
    state, _ = _train(models["tiny"], dict(train_attn=True, train_mlp=True, train_unembed=False), "w-publish")
    adapter = _download(env, state, tmp_path / "dl")
    peft_dir = tmp_path / "peft"
    build_lora_adapter(base_model=dirs["tiny"], adapter_path=str(adapter), output_path=str(peft_dir))
    calls: list = []

    class RecordingApi:  # the Hub is not reachable here: record what would be sent
        def __init__(self, token=None):
            calls.append(("init", token))

        def create_repo(self, **kw):
            calls.append(("create_repo", kw))

        def upload_folder(self, **kw):
            calls.append(("upload_folder", kw, sorted(p.name for p in Path(kw["folder_path"]).iterdir())))

    monkeypatch.setattr(publish, "HfApi", RecordingApi)
    url = publish_to_hf_hub(model_path=str(peft_dir), repo_id="me/tiny-lora",
                            model_card=ModelCardConfig(base_model="loops/tiny", tags=["sft"]))
    assert url == "https://huggingface.co/me/tiny-lora"
    assert calls[1] == ("create_repo", {"repo_id": "me/tiny-lora", "repo_type": "model", "private": True, "exist_ok": True})
    assert calls[2][0] == "upload_folder" and calls[2][1]["folder_path"] == str(peft_dir)
    assert calls[2][2] == ["README.md", "adapter_config.json", "adapter_model.safetensors"]
    card = (peft_dir / "README.md").read_text()
    assert "library_name: peft" in card and "base_model: loops/tiny" in card


def test_tinker_layout_adapter_imports(server, tmp_path):
    """An adapter written by hand in Tinker's layout (unembedding LoRA as
    model.unembed_tokens) imports with `loops checkpoints import` and samples as PEFT does
    with the same tensors under PEFT's names."""
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM

    srv, env, dirs = server
    os.environ["TINKER_BASE_URL"] = env["TINKER_BASE_URL"]
    tiny_dir = dirs["tiny"]
    base = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
    gen = torch.Generator().manual_seed(39)
    r, alpha = 4, 8
    weights = {}
    for name, mod in base.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        if leaf in ("q_proj", "v_proj", "down_proj", "lm_head"):
            key = "base_model.model.model.unembed_tokens" if leaf == "lm_head" else f"base_model.model.{name}"
            weights[key + ".lora_A.weight"] = torch.randn(r, mod.in_features, generator=gen) * 0.1
            weights[key + ".lora_B.weight"] = torch.randn(mod.out_features, r, generator=gen) * 0.1
    tinker_dir = tmp_path / "tinker-adapter"
    tinker_dir.mkdir()
    save_file(weights, str(tinker_dir / "adapter_model.safetensors"))
    (tinker_dir / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "r": r, "lora_alpha": alpha, "task_type": "CAUSAL_LM",
        "target_modules": ["down_proj", "q_proj", "unembed_tokens", "v_proj"], "base_model_name_or_path": "loops/tiny"}))

    # PEFT's answer: the same tensors under PEFT's names; Tinker's unembedding of a tied model
    # adapts the shared matrix, which PEFT calls ensure_weight_tying.
    pm = get_peft_model(base, LoraConfig(r=r, lora_alpha=alpha, target_modules=["q_proj", "v_proj", "down_proj", "lm_head"],
                                         ensure_weight_tying=True))
    peft_sd = {k.replace("base_model.model.model.unembed_tokens.", "base_model.model.lm_head."): v for k, v in weights.items()}
    from peft import set_peft_model_state_dict

    res = set_peft_model_state_dict(pm, peft_sd)
    assert not res.unexpected_keys
    want = _logprobs(pm.eval())

    proc = subprocess.run([str(loops_binary()), "checkpoints", "import", str(tinker_dir), "--base-model", "loops/tiny",
                           "--name", "tinker-layout", "--url", srv.url, "--api-key", API_KEY],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    path = proc.stdout.split()[1]
    sc = tinker.ServiceClient().create_sampling_client(model_path=path)
    got = _server_logprobs(sc)
    diff = _maxdiff(want, got)
    print(f"\n[weights] Tinker-layout adapter imported: max |logprob(Loops) - logprob(PEFT)| = {diff:.2g}")
    assert diff < TOL
    assert _maxdiff(want, _logprobs(AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32))) > 1e-2

    # PEFT's own save of that adapter (ensure_weight_tying: the head's pair and the
    # embedding's lora_embedding_A/B copies of it) imports as the same adapter.
    pm.save_pretrained(str(tmp_path / "peft-saved"), save_embedding_layers=False)
    saved = load_file(str(tmp_path / "peft-saved" / "adapter_model.safetensors"))
    assert "base_model.model.model.embed_tokens.lora_embedding_A" in saved
    proc = subprocess.run([str(loops_binary()), "checkpoints", "import", str(tmp_path / "peft-saved"), "--base-model",
                           "loops/tiny", "--name", "peft-tied", "--url", srv.url, "--api-key", API_KEY],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = _server_logprobs(tinker.ServiceClient().create_sampling_client(model_path=proc.stdout.split()[1]))
    print(f"[weights] PEFT-saved tied adapter imported: max |logprob(Loops) - logprob(PEFT)| = {_maxdiff(want, got):.2g}")
    assert _maxdiff(want, got) < TOL


def test_zz_table():
    """Prints the family x path x max |delta log-prob| table of this run."""
    if not TABLE:
        pytest.skip("no cell ran")
    cols = ["build_hf_model/shard", "build_hf_model/full", "build_lora_adapter", "build_lora_adapter → loops import",
            "build_lora_adapter (PEFT loads no experts)", "build_lora_adapter experts vs merged"]
    lines = ["| family | LoRA | " + " | ".join(cols) + " |", "|---|---|" + "---|" * len(cols)]
    for row in TABLE:
        lines.append(f"| {row['family']} | {row['flags']} | " + " | ".join(
            f"{row[c]:.2g}" if c in row else "" for c in cols) + " |")
    print("\n" + "\n".join(lines))
