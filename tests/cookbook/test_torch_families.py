"""The tinker 0.38 SDK trains and samples every family of the torch worker through
`loops serve --backend torch --model DIR`: one server serves each family's tiny random model
(the parity test's configs, backends/torch/tests/family_models.py, with loops/tiny's
tokenizer), plus the vision-language packagings of Qwen3.5 (Qwen/Qwen3.5-4B, the cookbook's
default; without the image processor's preprocessor_config.json its language model is served on
text and an image chunk is a 400) and Kimi K2.5. The
catalog (get_server_capabilities) names each model's family, publisher and cookbook renderer;
three optimizer steps lower the loss; seeded sampling from the saved weights repeats."""

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

sys.path.insert(0, str(REPO_ROOT / "backends" / "torch" / "tests"))
sys.path.insert(0, str(REPO_ROOT / "backends" / "torch"))
from family_models import CONFIGS, FAMILY_OF, build  # noqa: E402 - the parity test's tiny models
from loops_worker.families import BY_MODEL_TYPE  # noqa: E402 - stdlib only

# every family's tiny model (the parity test's configs), and the vision-language packagings
# whose text family has no other form here (Kimi K2.5) or is the cookbook's default
# (Qwen/Qwen3.5-4B); the other VL packagings train the same text model
FAMILIES = list(CONFIGS) + ["qwen3_5_vl", "kimi_k25"]
VL = {"qwen3_5_vl", "kimi_k25"}
# Adam's learning rate: 5e-2 overshoots on several random inits within three steps (MiniMax-M2
# 93.8 → 121, Mistral 93.4 → 99); at 1e-2 every family's loss falls by 15% (GLM-5) to 49% (gpt-oss)
STEPS, LR = 3, 1e-2
# a 1×1 PNG (the smallest valid image: it passes the header checks)
PNG_1X1 = bytes.fromhex("89504e470d0a1a0a0000000d49484452000000010000000108000000003a7e9b55"
                        "0000000e49444154789c626200040000ffff00060003fad059ae0000000049454e44ae426082")
TRAIN = [[5, 9, 33, 70, 11, 2, 17, 18], [8, 1, 300, 4, 19, 64, 3, 250, 6]]


def _build(family: str, out: Path, tiny_dir: Path) -> None:
    vocab = json.loads((tiny_dir / "config.json").read_text())["vocab_size"]
    build(family, out, vocab_size=vocab, max_position_embeddings=512)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(tiny_dir / f, out / f)


def _family(base: str):
    """The worker's family of a tiny folder (what the catalog must say)."""
    mt = json.loads((Path(base) / "config.json").read_text())["model_type"]
    return BY_MODEL_TYPE[mt]


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
@pytest.mark.parametrize("family", FAMILIES)
def test_sdk_trains_and_samples(torch_families, family, monkeypatch):
    srv, dirs = torch_families
    monkeypatch.setenv("TINKER_BASE_URL", srv.url)
    base = dirs[family]
    sc = tinker.ServiceClient()
    assert base in [m.model_name for m in sc.get_server_capabilities().supported_models]
    # the SDK's SupportedModel keeps only model_name; the catalog fields are in the JSON
    caps = httpx.get(f"{srv.url}/api/v1/get_server_capabilities", headers={"X-API-Key": API_KEY}).json()
    entry = {m["model_name"]: m for m in caps["supported_models"]}[base]
    fam = _family(base)
    assert fam.name == FAMILY_OF[family]
    assert (entry["family"], entry["publisher"], entry["renderer_name"]) == (fam.name, fam.publisher, fam.renderer), entry
    assert set(fam.experts) <= set(entry["lora_targets"]) and "lm_head" in entry["lora_targets"], entry

    tc = sc.create_lora_training_client(base_model=base, rank=4, seed=3)
    data = [types.Datum(model_input=types.ModelInput.from_ints(s[:-1]),
                        loss_fn_inputs={"target_tokens": s[1:], "weights": [1.0] * (len(s) - 1)}) for s in TRAIN]

    def loss(out):
        return sum(float(-sum(o["logprobs"].tolist())) for o in out.loss_fn_outputs)

    losses = []  # before each step (forward_backward's own outputs), then after the last
    for _ in range(STEPS):
        losses.append(loss(tc.forward_backward(data, "cross_entropy").result()))
        tc.optim_step(types.AdamParams(learning_rate=LR)).result()
    losses.append(loss(tc.forward(data, "cross_entropy").result()))
    print(f"LOSS {family}: " + " -> ".join(f"{x:.1f}" for x in losses))
    assert losses[-1] < 0.95 * losses[0], losses

    # seeded sampling from the saved weights repeats (the parity test checks its log-probs)
    sampler = tc.save_weights_and_get_sampling_client(f"fam-{family}")
    params = types.SamplingParams(max_tokens=6, temperature=1.0, seed=11)
    prompt = types.ModelInput.from_ints(TRAIN[0][:4])
    a, b = (sampler.sample(prompt, num_samples=2, sampling_params=params) for _ in range(2))
    a, b = a.result(), b.result()
    assert [s.tokens for s in a.sequences] == [s.tokens for s in b.sequences]
    assert all(len(s.tokens) == len(s.logprobs) > 0 for s in a.sequences)
    if family in VL:
        # an image chunk is refused (a 400 that says so), never dropped: the catalog says text only
        img = types.ModelInput(chunks=[types.EncodedTextChunk(tokens=TRAIN[0][:3]),
                                       types.ImageChunk(data=PNG_1X1, format="png", expected_tokens=4)])
        with pytest.raises(tinker.BadRequestError) as e:
            tc.forward([types.Datum(model_input=img, loss_fn_inputs={"target_tokens": [1, 2, 3, 4, 5, 6, 7],
                                                                      "weights": [1.0] * 7})], "cross_entropy").result()
        assert f"model {base} takes [text] input only, not images" in str(e.value)

