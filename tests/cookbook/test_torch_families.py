"""The tinker 0.38 SDK trains and samples the torch worker's new families through
`loops serve --backend torch --model DIR`: Qwen3-MoE (LoRA on attention and per expert) and
Qwen3.5 (Gated DeltaNet + full attention; the cookbook's default family) as a text model and
packaged as Qwen/Qwen3.5-4B is (a vision-language checkpoint; without the image processor's
preprocessor_config.json it is served for text and an image chunk is a 400), each a tiny random model written from a fixed seed with
loops/tiny's tokenizer. The catalog
(get_server_capabilities) names each model's family and cookbook renderer; a few optimizer
steps lower the loss; seeded sampling from the saved weights repeats."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import httpx
import pytest

torch = pytest.importorskip("torch")
import tinker  # noqa: E402
from tinker import types  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "tests"))
from conftest import API_KEY  # noqa: E402
from loops_server import running_server  # noqa: E402
from test_weights import _torch_python, tiny_tokenizer  # noqa: E402,F401 - the fixture is reused

# family -> (model_type, config overrides, cookbook renderer)
FAMILIES = {
    "qwen3_moe": ("qwen3_moe", dict(moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2), "qwen3"),
    "qwen3_5": ("qwen3_5_text", dict(linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=16,
                                     linear_value_head_dim=16, layer_types=["linear_attention", "full_attention"]),
                "qwen3_5"),
    # Qwen/Qwen3.5-4B's packaging, the cookbook's default model: a vision-language checkpoint
    # (model_type qwen3_5, Qwen3_5ForConditionalGeneration) whose language model is served on text
    "qwen3_5_vl": ("qwen3_5", dict(linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=16,
                                   linear_value_head_dim=16, layer_types=["linear_attention", "full_attention"]),
                   "qwen3_5"),
}
# Adam's learning rate per case (default 5e-2): on the VL folder's random init 5e-2 overshoots
# (the loss goes 96 → 89 → 91 → 79 → 333 through the engine), 1e-2 falls every step
LR = {"qwen3_5_vl": 1e-2}
# a case's family in the catalog (the VL checkpoint's language model is qwen3_5's)
FAMILY_OF = {"qwen3_5_vl": "qwen3_5"}
VISION = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, patch_size=4,
              temporal_patch_size=1, spatial_merge_size=1)
# a 1×1 PNG (the smallest valid image: it passes the header checks)
PNG_1X1 = bytes.fromhex("89504e470d0a1a0a0000000d49484452000000010000000108000000003a7e9b55"
                        "0000000e49444154789c626200040000ffff00060003fad059ae0000000049454e44ae426082")
TRAIN = [[5, 9, 33, 70, 11, 2, 17, 18], [8, 1, 300, 4, 19, 64, 3, 250, 6]]


def _build(family: str, out: Path, tiny_dir: Path) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    mt, kw, _ = FAMILIES[family]
    vocab = json.loads((tiny_dir / "config.json").read_text())["vocab_size"]
    text = dict(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
                tie_word_embeddings=False, eos_token_id=2, **kw)
    torch.manual_seed(7)
    if family in FAMILY_OF:  # the full VL model, saved as its checkpoints are (model.language_model.*)
        cfg = AutoConfig.for_model(mt, text_config=text, vision_config=VISION, tie_word_embeddings=False)
        m = AutoModelForImageTextToText.from_config(cfg, dtype=torch.float32)
    else:
        m = AutoModelForCausalLM.from_config(AutoConfig.for_model(mt, **text), dtype=torch.float32)
    with torch.no_grad():  # fused experts are created empty
        for p in m.parameters():
            if p.dim() == 3:
                p.normal_(0, 0.05)
    m.save_pretrained(out)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(tiny_dir / f, out / f)


@pytest.fixture(scope="module")
def torch_families(tiny_tokenizer, tmp_path_factory, recipe_env):  # noqa: F811
    py = _torch_python()
    if py is None:
        pytest.skip("no torch worker venv (LOOPS_TORCH_PYTHON): these families are served by the torch worker")
    root = tmp_path_factory.mktemp("families")
    dirs = {}
    args = ["--backend", "torch", "--backend-opt", f"python={py}",
            "--backend-opt", f"pythonpath={REPO_ROOT / 'backends' / 'torch'}"]
    for fam in FAMILIES:
        _build(fam, root / fam, tiny_tokenizer)
        dirs[fam] = str(root / fam)
        args += ["--model", dirs[fam]]
    with running_server("families-torch", extra_args=args) as srv:
        yield srv, dirs


@pytest.mark.timeout(600)
@pytest.mark.parametrize("family", list(FAMILIES))
def test_sdk_trains_and_samples(torch_families, family, monkeypatch):
    srv, dirs = torch_families
    monkeypatch.setenv("TINKER_BASE_URL", srv.url)
    base = dirs[family]
    sc = tinker.ServiceClient()
    assert base in [m.model_name for m in sc.get_server_capabilities().supported_models]
    # the SDK's SupportedModel keeps only model_name; the catalog fields are in the JSON
    caps = httpx.get(f"{srv.url}/api/v1/get_server_capabilities", headers={"X-API-Key": API_KEY}).json()
    entry = {m["model_name"]: m for m in caps["supported_models"]}[base]
    assert entry["family"] == FAMILY_OF.get(family, family) and entry["renderer_name"] == FAMILIES[family][2], entry
    if family == "qwen3_moe":
        assert {"gate_up_proj", "down_proj"} <= set(entry["lora_targets"]), entry

    tc = sc.create_lora_training_client(base_model=base, rank=4, seed=3)
    data = [types.Datum(model_input=types.ModelInput.from_ints(s[:-1]),
                        loss_fn_inputs={"target_tokens": s[1:], "weights": [1.0] * (len(s) - 1)}) for s in TRAIN]

    def loss():
        out = tc.forward(data, "cross_entropy").result()
        return sum(float(-sum(o["logprobs"].tolist())) for o in out.loss_fn_outputs)

    before = loss()
    for _ in range(4):
        tc.forward_backward(data, "cross_entropy").result()
        tc.optim_step(types.AdamParams(learning_rate=LR.get(family, 5e-2))).result()
    after = loss()
    assert after < 0.9 * before, (before, after)

    sampler = tc.save_weights_and_get_sampling_client(f"fam-{family}")
    params = types.SamplingParams(max_tokens=6, temperature=1.0, seed=11)
    prompt = types.ModelInput.from_ints(TRAIN[0][:4])
    a = sampler.sample(prompt, num_samples=2, sampling_params=params).result()
    b = sampler.sample(prompt, num_samples=2, sampling_params=params).result()
    assert [s.tokens for s in a.sequences] == [s.tokens for s in b.sequences]
    assert all(len(s.tokens) == len(s.logprobs) > 0 for s in a.sequences)
    if family in FAMILY_OF:
        # an image chunk is refused (a 400 that says so), never dropped: the catalog says text only
        img = types.ModelInput(chunks=[types.EncodedTextChunk(tokens=TRAIN[0][:3]),
                                       types.ImageChunk(data=PNG_1X1, format="png", expected_tokens=4)])
        with pytest.raises(tinker.BadRequestError) as e:
            tc.forward([types.Datum(model_input=img, loss_fn_inputs={"target_tokens": [1, 2, 3, 4, 5, 6, 7],
                                                                      "weights": [1.0] * 7})], "cross_entropy").result()
        assert f"model {base} takes [text] input only, not images" in str(e.value)

