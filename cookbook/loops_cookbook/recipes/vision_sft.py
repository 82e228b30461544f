"""Supervised fine-tuning of a vision-language model on images it draws itself, with a
held-out eval loss before and after.

The data set is synthetic and made from `seed`: each example is a small picture (a random
shade of one of eight colours, red, green, blue, yellow, black, white, purple or orange,
filling the image, with a shape of another colour's shade drawn on it) and the question "What colour is this?"; the answer is the colour's word. Train and eval
pictures are drawn from different random streams, so the eval pictures are never trained on.
Each conversation is rendered with tinker-cookbook's Qwen3-VL renderer (`renderer`), which
puts each picture in the model input as an image chunk (its bytes and its expected token
count, from the model's image processor) between <|vision_start|> and <|vision_end|>; the loss
is cross-entropy on the answer tokens only. metrics.jsonl rows: train_loss (per answer token)
and eval_loss on the steps that evaluate (per answer token, nats, by `forward`: no gradient).
The summary adds eval_accuracy_start/_end: the share of held-out pictures whose most likely
answer, among every colour's word, is the right one (chance is 1/8).

Needs tinker-cookbook (its renderers and image helper) and Pillow on the client: `pip install
"loops-cookbook[vision]"`. The model must take images (a Qwen3-VL checkpoint served by `loops
serve --backend torch`)."""

from __future__ import annotations

import dataclasses
import random

from loops_cookbook.config import BaseConfig, field

DATA_FORMAT = """
None to supply: the recipe draws its pictures from `seed` (train_size training and
eval_size held-out pictures of image_size×image_size pixels; a colour's shades vary, a
distractor shape of another shade is drawn on each) and asks "What colour is this?"; the
answer is the colour's word.
"""

# colour word -> RGB centre; each picture jitters it by up to ±JITTER per channel
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30), "green": (30, 180, 40), "blue": (30, 60, 220), "yellow": (235, 220, 40),
    "black": (15, 15, 15), "white": (240, 240, 240), "purple": (140, 40, 170), "orange": (245, 140, 20),
}
JITTER = 25
# images one request may carry on Loops (the gateway's limit): a training batch is one
# request, and the evaluations are sent in requests of this many pictures
MAX_IMAGES = 16
QUESTION = "What colour is this?"


@dataclasses.dataclass
class Config(BaseConfig):
    model: str = field("Qwen/Qwen3-VL-2B-Instruct", "base model to fine-tune (LoRA); it must take images (Qwen3-VL, Qwen3.5)")
    renderer: str = field("qwen3_vl_instruct", "tinker-cookbook renderer (qwen3_vl_instruct, qwen3_vl, qwen3_5, ...)")
    train_size: int = field(64, "training pictures drawn")
    eval_size: int = field(16, "held-out pictures drawn (another random stream)")
    image_size: int = field(32, "picture side in pixels (the model's image processor resizes it)")
    batch_size: int = field(8, "conversations per step")
    eval_every: int = field(5, "measure the eval loss every N steps (and at the first and last)")
    learning_rate: float = field(5e-3, "Adam learning rate (constant); 1e-4 is a usual start on a real model")


def data_files(cfg: Config) -> dict:
    """No data files: the recipe draws its own pictures."""
    return {}


def token_lengths(cfg: Config, chat) -> list[int]:
    """The text tokens of one conversation (the same for every picture), for check's
    sequence-length row; the image tokens are counted by estimate(), which loads the
    model's image processor (check --estimate)."""
    return [len(chat.conversation([{"role": "user", "content": QUESTION},
                                   {"role": "assistant", "content": w}])[0]) for w in COLOURS]


def pictures(seed: int, n: int, size: int, stream: str) -> list[tuple[object, str]]:
    """n (PIL image, colour word) pairs drawn from (seed, stream): a jittered shade of the
    colour fills the picture, and a rectangle or ellipse of another colour's shade covers at
    most a quarter of it."""
    from PIL import Image, ImageDraw

    rng = random.Random(f"{seed}:{stream}")
    words = list(COLOURS)
    out = []
    for i in range(n):
        word = words[i % len(words)] if i < len(words) else rng.choice(words)

        def shade(w: str) -> tuple[int, int, int]:
            return tuple(min(255, max(0, c + rng.randint(-JITTER, JITTER))) for c in COLOURS[w])  # type: ignore[return-value]

        img = Image.new("RGB", (size, size), shade(word))
        other = rng.choice([w for w in words if w != word])
        side = rng.randint(size // 6, size // 2)
        x, y = rng.randint(0, size - side), rng.randint(0, size - side)
        draw = ImageDraw.Draw(img)
        (draw.rectangle if rng.random() < 0.5 else draw.ellipse)([x, y, x + side - 1, y + side - 1], fill=shade(other))
        out.append((img, word))
    rng.shuffle(out)
    return out


def conversation(img: object, word: str) -> list[dict]:
    """The chat of one picture: a user turn holding the image and the question, the answer."""
    return [{"role": "user", "content": [{"type": "image", "image": img}, {"type": "text", "text": QUESTION}]},
            {"role": "assistant", "content": word}]


def renderer_for(cfg: Config, tokenizer):
    """tinker-cookbook's renderer with the model's image processor (loaded from cfg.model, a
    local folder or a name in the HF cache)."""
    from tinker_cookbook import renderers
    from tinker_cookbook.image_processing_utils import get_image_processor

    return renderers.get_renderer(cfg.renderer, tokenizer, get_image_processor(cfg.model))


@dataclasses.dataclass
class Data:
    """Every datum the run sends, built by the renderer: train (forward_backward batches are
    drawn from it), evals (its eval loss, by forward), held_out (the eval pictures and their
    words) and choices (each held-out picture with every colour's word, in that order: the
    accuracy's forward requests, at the start and at the end)."""

    train: list
    evals: list
    held_out: list[tuple[object, str]]
    choices: list


def check_config(cfg: Config) -> None:
    """Refuses a config the run cannot do, before it starts: the client packages it needs,
    batch_size and image_size in range."""
    try:
        import PIL  # noqa: F401
        import tinker_cookbook  # noqa: F401
    except ImportError as e:
        raise RuntimeError(f"vision_sft needs tinker-cookbook and Pillow ({e}): pip install 'loops-cookbook[vision]'") from e
    if not 1 <= cfg.batch_size <= MAX_IMAGES:
        raise ValueError(f"batch_size={cfg.batch_size}: want 1 to {MAX_IMAGES} (one picture per conversation, and a "
                         f"request carries at most {MAX_IMAGES} images)")
    if not 8 <= cfg.image_size <= 2048:
        raise ValueError(f"image_size={cfg.image_size}: want 8 to 2048 pixels a side")


def datasets(cfg: Config, tokenizer) -> Data:
    """The run's datums: each conversation rendered by renderer_for (its image chunk's
    expected_tokens from the model's image processor, which the server checks) and cut to
    cfg.max_length. main() trains and evaluates on them; estimate() counts them."""
    check_config(cfg)
    from tinker_cookbook.supervised.common import datum_from_model_input_weights

    renderer = renderer_for(cfg, tokenizer)

    def to_datum(img: object, word: str):
        model_input, weights = renderer.build_supervised_example(conversation(img, word))
        return datum_from_model_input_weights(model_input, weights, cfg.max_length)

    held_out = pictures(cfg.seed, cfg.eval_size, cfg.image_size, "eval")
    return Data(train=[to_datum(*p) for p in pictures(cfg.seed, cfg.train_size, cfg.image_size, "train")],
                evals=[to_datum(*p) for p in held_out], held_out=held_out,
                choices=[to_datum(img, w) for img, _ in held_out for w in COLOURS])


def estimate(cfg: Config, chat) -> dict:
    """The run's EstimateCost request, exact: the model input length (text tokens and each
    image chunk's expected_tokens, as the server meters them) of every datum main() sends,
    as training tokens: the accuracy's forward over `choices` at the start and at the end,
    the eval loss's forward at the start and on the steps that evaluate, and each step's
    forward_backward batch (supervised_loop's own schedule)."""
    from loops_cookbook import pilot
    from loops_cookbook.runtime import supervised_schedule

    data = datasets(cfg, chat.tok)
    train = [d.model_input.length for d in data.train]
    evals = sum(d.model_input.length for d in data.evals)
    tokens = 2 * sum(d.model_input.length for d in data.choices) + evals
    for _, batch, evaluates in supervised_schedule(cfg, len(train)):
        tokens += sum(train[i] for i in batch) + (evals if evaluates else 0)
    return pilot.request(cfg.model, [pilot.exact(trained=tokens)])


def main(cfg: Config) -> dict:
    from loops_cookbook.runtime import Run, forward_logprob_sums, supervised_loop

    check_config(cfg)
    run = Run("vision_sft", cfg)
    data = datasets(cfg, run.tokenizer)
    words = list(COLOURS)

    def accuracy() -> float:
        """The share of held-out pictures whose most likely answer, among every colour's word,
        is the right one (chance: 1/len(COLOURS))."""
        lp = forward_logprob_sums(run.training, data.choices, MAX_IMAGES)
        picked = [words[max(range(len(words)), key=lambda j: lp[i * len(words) + j])] for i in range(len(data.held_out))]
        return sum(p == w for p, (_, w) in zip(picked, data.held_out)) / max(1, len(data.held_out))

    accuracy_start = accuracy()
    summary = supervised_loop(run, cfg, data.train, data.evals, MAX_IMAGES)
    summary.update(eval_accuracy_start=accuracy_start, eval_accuracy_end=accuracy())
    return {**summary, "final": run.finish(cfg.steps)}
