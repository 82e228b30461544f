"""The tinker 0.38 SDK trains and samples with image chunks through `loops serve --backend
torch --model DIR` on a tiny random Qwen3-VL (written from a fixed seed with transformers,
with its image processor's preprocessor_config.json and loops/tiny's tokenizer plus Qwen-VL's
vision special tokens): the
catalog says modalities text and image; forward_backward with an image chunk (weights on
the text targets, as a renderer gives) lowers the loss over a few steps; seeded sampling and
compute_logprobs with the image repeat; an expected_tokens that is not the processor's, a
30000×30000 image header and the wrong format are 400s that say so. On the same server:
tinker-cookbook's Qwen3-VL renderer round-trips a conversation with an image, and our
cookbook's vision_sft recipe learns (held-out loss and accuracy).

The worker runs transformers' image processor, which needs Pillow in the worker's
environment; without it the test is skipped (the worker then serves the model for text)."""

from __future__ import annotations

import binascii
import io
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

torch = pytest.importorskip("torch")
import tinker  # noqa: E402
from tinker import types  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "tests"))
sys.path.insert(0, str(REPO_ROOT / "cookbook"))  # the vision_sft recipe's picture maker
from conftest import API_KEY  # noqa: E402
from loops_server import loops_binary, running_server  # noqa: E402
from test_weights import _torch_python, tiny_tokenizer  # noqa: E402,F401 - the fixture is reused

# The server's price sheet: vision_sft's `loops cookbook check --estimate` is checked against
# what its run was metered.
PRICES = 'models:\n  "*": {prefill: "0.20", cached_prefill: "0.05", sample: "0.60", train: "0.40"}\n'
PIC = (24, 16)  # 6×4 patches of 4 pixels, merged 2×2: 6 tokens
VISION_TOKENS = dict(image_token_id="<|image_pad|>", video_token_id="<|video_pad|>",
                     vision_start_token_id="<|vision_start|>", vision_end_token_id="<|vision_end|>")
PROC = dict(patch_size=4, temporal_patch_size=2, merge_size=2, size={"shortest_edge": 64, "longest_edge": 4096})


def _png(w: int, h: int, seed: int) -> bytes:
    from PIL import Image

    g = torch.Generator().manual_seed(seed)
    px = (torch.rand((h, w, 3), generator=g) * 255).to(torch.uint8).numpy()
    b = io.BytesIO()
    Image.fromarray(px).save(b, format="PNG")
    return b.getvalue()


def _png_header(w: int, h: int) -> bytes:
    """A PNG signature and IHDR claiming w×h pixels, and nothing else."""
    ihdr = struct.pack(">IIBBBBB", w, h, 8, 6, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + b"IHDR" + ihdr + struct.pack(">I", binascii.crc32(b"IHDR" + ihdr))


def _build(out: Path, tiny_dir: Path) -> dict:
    from transformers import AutoConfig, AutoModelForImageTextToText
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from transformers import AutoTokenizer

    # loops/tiny's tokenizer with the Qwen-VL vision markers added as special tokens, as
    # Qwen3-VL's own tokenizer has them (the cookbook's Qwen3-VL renderer writes them by name)
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    tok.add_special_tokens({"additional_special_tokens": list(VISION_TOKENS.values())})
    tok.save_pretrained(out)
    ids = {k: tok.convert_tokens_to_ids(v) for k, v in VISION_TOKENS.items()}
    vocab = max(json.loads((tiny_dir / "config.json").read_text())["vocab_size"], len(tok))
    text = dict(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, max_position_embeddings=512, tie_word_embeddings=False, eos_token_id=2,
                rope_parameters=dict(rope_type="default", rope_theta=10000.0, mrope_section=[4, 2, 2], mrope_interleaved=True))
    vision = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, patch_size=4,
                  temporal_patch_size=2, spatial_merge_size=2, num_position_embeddings=16, deepstack_visual_indexes=[0])
    cfg = AutoConfig.for_model("qwen3_vl", text_config=text, vision_config=vision, tie_word_embeddings=False, **ids)
    torch.manual_seed(7)
    AutoModelForImageTextToText.from_config(cfg, dtype=torch.float32).save_pretrained(out)
    Qwen2VLImageProcessorPil(**PROC).save_pretrained(out)
    return ids


@pytest.fixture(scope="module")
def vl_server(tiny_tokenizer, tmp_path_factory, recipe_env):  # noqa: F811
    pytest.importorskip("PIL", reason="the test builds its images with Pillow")
    py = _torch_python()
    if py is None:
        pytest.skip("no torch worker venv (LOOPS_TORCH_PYTHON): image chunks are served by the torch worker")
    # the worker's environment: the torch package, and LOOPS_TEST_WORKER_PYTHONPATH (e.g. a
    # folder holding Pillow while the worker venv lacks it)
    pp = os.pathsep.join(p for p in (str(REPO_ROOT / "backends" / "torch"), os.environ.get("LOOPS_TEST_WORKER_PYTHONPATH")) if p)
    if subprocess.run([py, "-c", "import PIL"], env={**os.environ, "PYTHONPATH": pp}, capture_output=True).returncode != 0:
        pytest.skip("the torch worker's environment has no Pillow, which transformers' image processors need: "
                    "image chunks are not served there (the model is served for text)")
    d = tmp_path_factory.mktemp("vision") / "qwen3_vl"
    ids = _build(d, tiny_tokenizer)
    sheet = d.parent / "prices.yaml"
    sheet.write_text(PRICES)
    args = ["--backend", "torch", "--backend-opt", f"python={py}", "--backend-opt", f"pythonpath={pp}", "--model", str(d),
            "--prices", str(sheet)]
    with running_server("vision-torch", extra_args=args) as srv:
        yield srv, str(d), ids


@pytest.mark.timeout(600)
def test_sdk_trains_and_samples_with_images(vl_server, monkeypatch):
    srv, base, ids = vl_server
    monkeypatch.setenv("TINKER_BASE_URL", srv.url)
    sc = tinker.ServiceClient()
    caps = httpx.get(f"{srv.url}/api/v1/get_server_capabilities", headers={"X-API-Key": API_KEY}).json()
    entry = {m["model_name"]: m for m in caps["supported_models"]}[base]
    assert entry["family"] == "qwen3_vl" and entry["modalities"] == ["text", "image"], entry

    img, end = ids["image_token_id"], ids["vision_end_token_id"]
    pics = [_png(*PIC, seed=s) for s in (1, 2)]
    texts = [[5, 9, 33], [8, 1, 30]]
    after = [[70, 11, 2, 17, 18, 40], [4, 19, 64, 3, 25, 6]]
    start = ids["vision_start_token_id"]

    def datum(pic, pre, post, expected=6, fmt="png"):
        mi = types.ModelInput(chunks=[types.EncodedTextChunk(tokens=pre + [start]),
                                      types.ImageChunk(data=pic, format=fmt, expected_tokens=expected),
                                      types.EncodedTextChunk(tokens=[end] + post[:-1])])
        # the full sequence's next tokens; a renderer weights the text targets only
        seq = pre + [start] + [img] * expected + [end] + post
        kinds = [0] * (len(pre) + 1) + [1] * expected + [0] * (len(post) + 1)
        return types.Datum(model_input=mi, loss_fn_inputs={
            "target_tokens": seq[1:], "weights": [0.0 if k else 1.0 for k in kinds[1:]]})

    data = [datum(p, t, a) for p, t, a in zip(pics, texts, after)]
    assert data[0].model_input.length == 4 + 6 + 6
    tc = sc.create_lora_training_client(base_model=base, rank=4, seed=3)

    def loss():
        out = tc.forward(data, "cross_entropy").result()
        return sum(float(-(o["logprobs"].to_torch() * torch.tensor(d.loss_fn_inputs["weights"].tolist())).sum())
                   for o, d in zip(out.loss_fn_outputs, data))

    losses = [loss()]
    for _ in range(4):
        tc.forward_backward(data, "cross_entropy").result()
        tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
        losses.append(loss())
    print("VISION losses:", " ".join(f"{x:.3f}" for x in losses))
    assert losses[-1] < 0.9 * losses[0], losses

    sampler = tc.save_weights_and_get_sampling_client("vision")
    prompt = types.ModelInput(chunks=[types.EncodedTextChunk(tokens=texts[0] + [start]),
                                      types.ImageChunk(data=pics[0], format="png", expected_tokens=6),
                                      types.EncodedTextChunk(tokens=[end])])
    params = types.SamplingParams(max_tokens=6, temperature=1.0, seed=11)
    a = sampler.sample(prompt, num_samples=2, sampling_params=params).result()
    b = sampler.sample(prompt, num_samples=2, sampling_params=params).result()
    assert [s.tokens for s in a.sequences] == [s.tokens for s in b.sequences]
    assert all(len(s.tokens) == len(s.logprobs) > 0 for s in a.sequences)
    lps = sampler.compute_logprobs(prompt).result()
    assert len(lps) == prompt.length
    # no log-prob for the image's positions, a number for the text after it
    assert all(x is None for x in lps[5:10]) and lps[10] is not None, lps

    # what is refused, each a 400 that says why
    for bad, why in (
        (datum(pics[0], texts[0], after[0], expected=5), "has expected_tokens 5, but"),
        (datum(_png_header(30000, 30000), texts[0], after[0]), "30000×30000 pixels, over the limit"),
        (datum(pics[0], texts[0], after[0], fmt="jpeg"), 'set format to \\"png\\"'),
    ):
        with pytest.raises(tinker.BadRequestError) as e:
            tc.forward([bad], "cross_entropy").result()
        assert why in str(e.value) or why.replace('\\"', '"') in str(e.value), str(e.value)
    with pytest.raises(tinker.BadRequestError) as e:
        sampler.sample(types.ModelInput(chunks=[types.EncodedTextChunk(tokens=[5]),
                                                types.ImageChunk(data=pics[0], format="png", expected_tokens=7)]),
                       num_samples=1, sampling_params=params).result()
    assert "makes 6 tokens of it" in str(e.value)


def test_qwen3_vl_renderer_round_trips_an_image(vl_server, monkeypatch):
    """tinker-cookbook 0.6.1's qwen3_vl_instruct renderer on the tiny VL folder's tokenizer and
    image processor: the generation prompt is the supervised example's start (the same text
    tokens and the same image chunk), the vision markers are the tokenizer's special tokens,
    parse_response of the rest gives the answer back, and the server takes the prompt's image
    chunk as it is (its expected_tokens is the worker's own count)."""
    from tinker_cookbook import renderers
    from tinker_cookbook.image_processing_utils import get_image_processor
    from transformers import AutoTokenizer

    srv, base, ids = vl_server
    from loops_cookbook.recipes.vision_sft import conversation, pictures

    tok = AutoTokenizer.from_pretrained(base)
    r = renderers.get_renderer("qwen3_vl_instruct", tok, get_image_processor(base))
    pic, word = pictures(0, 1, 32, "train")[0]
    convo = conversation(pic, word)
    prompt = r.build_generation_prompt(convo[:1])
    full, weights = r.build_supervised_example(convo)
    n = len(prompt.chunks)
    assert [type(c) for c in prompt.chunks] == [type(c) for c in full.chunks[:n]]
    for a, b in zip(prompt.chunks[:n - 1], full.chunks[:n - 1]):
        assert a == b, (a, b)
    last = prompt.chunks[-1].tokens
    assert full.chunks[n - 1].tokens[:len(last)] == last
    images = [c for c in prompt.chunks if isinstance(c, types.ImageChunk)]
    assert len(images) == 1 and images[0].expected_tokens == 16 and images[0].format == "jpeg"
    flat = [t for c in prompt.chunks if isinstance(c, types.EncodedTextChunk) for t in c.tokens]
    assert ids["vision_start_token_id"] in flat and ids["vision_end_token_id"] in flat
    # what the model would generate after the prompt, parsed, is the answer
    rest = list(full.chunks[n - 1].tokens[len(last):]) + [t for c in full.chunks[n:] for t in c.tokens]
    msg, ok = r.parse_response(rest)
    assert ok and msg["role"] == "assistant" and msg["content"] == word, (msg, tok.decode(rest))
    w = [float(x) for x in weights.tolist()]
    assert sum(w) == len(rest) and not any(w[: prompt.length]), "only the answer is trained"

    monkeypatch.setenv("TINKER_BASE_URL", srv.url)
    sampler = tinker.ServiceClient().create_sampling_client(base_model=base)
    lps = sampler.compute_logprobs(prompt).result()
    assert len(lps) == prompt.length


@pytest.mark.timeout(600)
def test_vision_sft_recipe_lowers_held_out_loss(vl_server, recipe_env, tmp_path):
    """Our cookbook's vision_sft recipe (cookbook/loops_cookbook/recipes/vision_sft.py), run as
    `python -m loops_cookbook run vision_sft` against the tiny Qwen3-VL: pictures it draws from
    its seed, rendered by the cookbook's Qwen3-VL renderer as image chunks, trained with
    cross_entropy on the answer tokens; in 40 steps its held-out loss falls by at least 20%
    and the held-out accuracy (the most likely of the eight colour words) reaches 0.375, where
    chance is 0.125 (measured, seed 0: loss 6.25 -> 0.83 nats per answer token, accuracy 0.25 ->
    0.81)."""
    import time

    srv, base, _ = vl_server
    env = {**recipe_env, "TINKER_BASE_URL": srv.url, "PYTHONPATH": str(REPO_ROOT / "cookbook")}
    log_dir = tmp_path / "vision_sft"
    settings = [f"model={base}", "steps=40", "eval_every=10", "seed=0"]
    cmd = [sys.executable, "-m", "loops_cookbook", "run", "vision_sft", *settings, f"log_dir={log_dir}", "progress=false"]
    t0 = time.time()
    p = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=540)
    assert p.returncode == 0, f"{' '.join(cmd)}\nexit {p.returncode}\n{p.stderr[-6000:]}"
    summary = json.loads(p.stdout.strip().splitlines()[-1])
    start, end = summary["eval_loss_start"], summary["eval_loss_end"]
    rows = [json.loads(x) for x in (log_dir / "metrics.jsonl").read_text().splitlines()]
    acc = summary["eval_accuracy_start"], summary["eval_accuracy_end"]
    print(f"VISION_SFT eval_loss {start:.4f} -> {end:.4f} ({(start - end) / start:.1%} lower); eval accuracy"
          f" {acc[0]:.3f} -> {acc[1]:.3f}; train_loss", " ".join(f"{r['train_loss']:.3f}" for r in rows),
          f"; {time.time() - t0:.0f}s")
    # it reads the picture: held-out pictures get their own colour's word at 3× chance or more
    assert acc[1] >= 0.375, acc
    assert [r["step"] for r in rows] == list(range(1, 41))
    assert summary["final"]["sampler_path"].startswith("tinker://")
    assert end <= 0.8 * start, (start, end)
    _estimate_is_the_metered_cost(srv.url, env, summary["run_id"], settings)


def _loops_v1(url: str, method: str, body: dict) -> dict:
    """A loops.v1 call over Connect's JSON protocol ("UsageService/GetUsage", ...)."""
    r = httpx.post(f"{url}/loops.v1.{method}", json=body, headers={"X-API-Key": API_KEY}, timeout=60)
    assert r.status_code == 200, (method, r.status_code, r.text)
    return r.json()


def _estimate_is_the_metered_cost(url: str, env: dict, run_id: str, overrides: list[str]) -> None:
    """`loops cookbook check vision_sft … --estimate` with the run's own settings prices it
    exactly: its training tokens (text and image tokens of every forward and
    forward_backward datum) and its cost equal what the run's session was metered, by kind
    (GetUsage rows of that session; the other tests of the module use other sessions)."""
    import re
    import time
    from decimal import Decimal

    t0 = time.time()
    p = subprocess.run([str(loops_binary()), "cookbook", "check", "vision_sft", *overrides, "--estimate",
                        "--python", sys.executable, "--cookbook-dir", str(REPO_ROOT / "cookbook"),
                        "--url", url, "--api-key", API_KEY], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr[-4000:]
    m = re.search(r"^cost estimate\s+PASS\s+\$([0-9.]+) \(prices ", p.stdout, re.M)
    assert m, p.stdout
    estimated = {k.upper(): int(n) for k, n in re.findall(r"^(\w+_tokens)\s+(\d+)\s", p.stdout, re.M)}

    session = _loops_v1(url, "TrainingService/GetTrainingRun", {"id": run_id})["sessionId"]
    metered: dict[str, int] = {}
    cost = Decimal(0)
    for b in _loops_v1(url, "UsageService/GetUsage", {}).get("buckets", []):
        if b.get("sessionId") != session:
            continue
        cost += Decimal(b.get("costUsd") or 0)
        if b["kind"].endswith("_TOKENS"):
            kind = b["kind"].removeprefix("USAGE_KIND_")
            metered[kind] = metered.get(kind, 0) + int(b["amount"])
    print(f"VISION_SFT estimate ${m.group(1)} {estimated} (check --estimate: {time.time() - t0:.0f}s); metered ${cost} {metered}")
    print(p.stdout)
    assert estimated == metered and set(metered) == {"TRAINING_TOKENS"}, (estimated, metered, p.stdout)
    assert Decimal(m.group(1)) == cost > 0, (m.group(1), cost)
