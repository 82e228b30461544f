"""tinker-cookbook 0.6.1 recipes run unmodified against Loops: only config flags and
environment variables differ from a user's run.

Model: the built-in `loops/tiny` (3.3M params, byte-level BPE with ChatML specials
<|im_start|>/<|im_end|>), which `loops serve` registers in the local HF cache so
`AutoTokenizer.from_pretrained("loops/tiny")` works offline. Renderer: `qwen3_instruct`
(ChatML without <think>; it only needs <|im_end|> to be one token). With renderer_name
given, the cookbook never consults its model table, so model_name=loops/tiny is sent
as is.

Healthy-run assertions follow /work/shared/reference/cookbook-notes.md §5 and §7.
Figures (first/last loss, kl_sample_train, staleness) are printed with -s and written
to $LOOPS_COOKBOOK_REPORT (JSON lines) when set.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

MODEL = ["model_name=loops/tiny", "renderer_name=qwen3_instruct", "lora_rank=8"]
RECIPE_TIMEOUT = int(os.environ.get("LOOPS_COOKBOOK_RECIPE_TIMEOUT", "300"))


def _report(name: str, **figures) -> None:
    line = json.dumps({"run": name, **figures})
    sys.stderr.write(f"\n[cookbook] {line}\n")
    if out := os.environ.get("LOOPS_COOKBOOK_REPORT"):
        with open(out, "a") as f:
            f.write(line + "\n")


def _log_dir(tmp_path: Path, name: str) -> Path:
    if keep := os.environ.get("LOOPS_COOKBOOK_KEEP"):
        return Path(keep) / name
    return tmp_path / name


def run_recipe(module: str, args: list[str], env: dict, log_path: Path, kill_when=None) -> float:
    """Run `python -m module args... log_path=...`; assert it exits 0. With kill_when, poll
    it while the recipe runs and SIGKILL the recipe once it returns True (a crash, for the
    resume test); then the exit status is not checked, and the return is -1 if the
    recipe finished before it could be killed."""
    cmd = [sys.executable, "-m", module, *args, f"log_path={log_path}"]
    out_path = log_path.parent / f"{log_path.name}.stdout.txt"
    t0 = time.time()
    with open(out_path, "a") as out:
        out.write(f"$ {' '.join(cmd)}\n")
        out.flush()
        p = subprocess.Popen(cmd, env=env, cwd=log_path.parent, stdout=out, stderr=subprocess.STDOUT)
        killed = False
        try:
            while p.poll() is None:
                if time.time() - t0 > RECIPE_TIMEOUT:
                    p.kill()
                    raise AssertionError(f"{module} ran past {RECIPE_TIMEOUT}s; log {out_path}")
                if kill_when is not None and kill_when():
                    p.kill()
                    killed = True
                    break
                time.sleep(0.05)
        finally:
            p.wait()
    took = time.time() - t0
    if kill_when is not None:
        return took if killed else -1.0
    tail = out_path.read_text()[-8000:]
    assert p.returncode == 0, f"{' '.join(cmd)}\nexit {p.returncode} after {took:.0f}s\n{tail}"
    return took


def read_jsonl(path: Path) -> list[dict]:
    assert path.exists(), f"{path} missing"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _is_final(r: dict) -> bool:
    return bool(r.get("final")) or r.get("name") == "final"


def check_checkpoints(records: list[dict], *, expect_sampler: bool = True) -> None:
    """checkpoints.jsonl well-formed: names, tinker paths, kinds, one final per run."""
    assert records, "checkpoints.jsonl is empty"
    for r in records:
        assert isinstance(r.get("name"), str) and r["name"], r
        assert "state_path" in r or "sampler_path" in r, r
        for key in ("state_path", "sampler_path"):
            if key in r:
                seg = "/weights/" if key == "state_path" else "/sampler_weights/"
                assert r[key].startswith("tinker://") and seg in r[key], r
                assert r[key].count("/") == 4, r
        if r.get("rolling"):
            assert "state_path" in r and "sampler_path" not in r, f"rolling record: {r}"
        elif expect_sampler:
            assert "state_path" in r and "sampler_path" in r, f"periodic/final record: {r}"
        if "batch" in r:
            assert isinstance(r["batch"], int) and r["batch"] >= 0, r


def assert_paths_exist(loops_url: str, records: list[dict]) -> None:
    import tinker

    rest = tinker.RestClient(base_url=loops_url)
    for r in records:
        if r.get("rolling"):
            continue  # the cookbook deletes superseded rolling checkpoints
        for key in ("state_path", "sampler_path"):
            if key in r:
                run = rest.get_training_run_by_tinker_path(r[key]).result(timeout=60)
                ids = [c.tinker_path for c in rest.list_checkpoints(run.training_run_id).result(timeout=60).checkpoints]
                assert r[key] in ids, f"{r[key]} not listed by the server"


# ----------------------------------------------------------------------------- chat_sl


@pytest.fixture(scope="session")
def conversations() -> Path:
    import tinker_cookbook

    path = Path(tinker_cookbook.__file__).parent / "example_data" / "conversations.jsonl"
    assert path.exists(), path
    return path


def test_chat_sl_train_checkpoint_resume(recipe_env, loops_url, conversations, tmp_path):
    """chat_sl on the bundled conversations with periodic + rolling checkpoints; the first
    run is killed (as by a crash) once it has saved batch >= 3, the second resumes it."""
    log = _log_dir(tmp_path, "chat_sl")
    log.parent.mkdir(parents=True, exist_ok=True)
    common = MODEL + [
        f"dataset={conversations}", "batch_size=8", "max_length=192", "learning_rate=5e-3",
        "lr_schedule=constant", "num_epochs=1", "save_every=2", "eval_every=0",
        "infrequent_eval_every=0", "rolling_save_every=1", "rolling_ttl_seconds=3600",
    ]
    ckpts = log / "checkpoints.jsonl"

    def saved_batch_3() -> bool:
        try:
            return any(r.get("batch", 0) >= 3 for r in read_jsonl(ckpts))
        except (AssertionError, json.JSONDecodeError):
            return False

    t1 = run_recipe("tinker_cookbook.recipes.chat_sl.train",
                    common + ["max_steps=16", "behavior_if_log_dir_exists=delete"], recipe_env, log,
                    kill_when=saved_batch_3)
    assert t1 > 0, "the first run finished before it could be interrupted"
    c1 = read_jsonl(ckpts)
    check_checkpoints(c1)
    assert not any(_is_final(r) for r in c1), c1
    assert any(r.get("rolling") for r in c1), f"rolling_save_every=1 wrote no rolling record: {c1}"
    assert any(r["name"] == "000002" and "sampler_path" in r for r in c1), f"no periodic checkpoint at 2: {c1}"
    last = [r for r in c1 if "state_path" in r][-1]

    t2 = run_recipe("tinker_cookbook.recipes.chat_sl.train",
                    common + ["max_steps=7", "behavior_if_log_dir_exists=resume"], recipe_env, log)
    out = (log.parent / f"{log.name}.stdout.txt").read_text()
    assert f"Resumed training from {last['state_path']}" in out, "second run did not resume from the last state"
    rows = [r for r in read_jsonl(log / "metrics.jsonl") if "train_mean_nll" in r]
    steps = [r["step"] for r in rows]
    assert steps == list(range(7)), f"steps after resume: {steps} (resumed at batch {last['batch']})"
    nll = [r["train_mean_nll"] for r in rows]
    assert all(math.isfinite(x) for x in nll)
    assert nll[0] > 4.0, f"a random tiny model should start near ln(512)=6.2: {nll}"
    assert nll[2] < nll[0] and min(nll[3:]) < nll[0] - 0.5, f"train_mean_nll did not fall: {nll}"
    # Not asserted: that the resumed steps equal an uninterrupted run's. tinker-cookbook 0.6.1
    # records `batch: N` for a state saved after batch N (and, with submit_ahead=1, N+1) were
    # already applied, so a resumed run trains those batches again (same on Tinker itself).
    c2 = read_jsonl(ckpts)
    check_checkpoints(c2)
    finals = [r for r in c2 if _is_final(r)]
    assert len(finals) == 1, c2
    assert_paths_exist(loops_url, c2)
    _report("chat_sl", nll_first=round(nll[0], 4), nll_last=round(nll[-1], 4), nll=[round(x, 3) for x in nll],
            resumed_at_batch=last["batch"], checkpoints=len(c2), seconds=[round(t1), round(t2)])


# ----------------------------------------------------------------------------- math_rl

MODES = {
    "sync": [],
    "async": ["max_steps_off_policy=2"],
    "stream": ["stream_minibatch_config.groups_per_batch=4",
               "stream_minibatch_config.num_minibatches=2"],
}
LOSSES = ["importance_sampling", "ppo", "cispo"]
RL_STEPS = 3


@pytest.mark.parametrize("loss_fn", LOSSES)
@pytest.mark.parametrize("mode", list(MODES))
def test_math_rl_arithmetic(recipe_env, loops_url, tmp_path, mode, loss_fn):
    log = _log_dir(tmp_path, f"math_rl-{mode}-{loss_fn}")
    log.parent.mkdir(parents=True, exist_ok=True)
    args = MODEL + [
        "env=arithmetic", "group_size=4", "groups_per_batch=4", "max_tokens=8",
        "learning_rate=1e-3", "eval_every=0", "save_every=2", f"max_steps={RL_STEPS}",
        f"loss_fn={loss_fn}", "behavior_if_log_dir_exists=delete",
    ] + MODES[mode]
    took = run_recipe("tinker_cookbook.recipes.math_rl.train", args, recipe_env, log)
    rows = read_jsonl(log / "metrics.jsonl")
    train_rows = [r for r in rows if "optim/kl_sample_train_v1" in r]
    assert len(train_rows) == RL_STEPS, f"{len(train_rows)} training rows, want {RL_STEPS}: {rows}"
    kl = [r["optim/kl_sample_train_v1"] for r in train_rows]
    kl2 = [r["optim/kl_sample_train_v2"] for r in train_rows]
    ent = [r["optim/entropy"] for r in train_rows]
    assert all(math.isfinite(x) and x > 0 for x in ent), f"entropy {ent}"
    assert all(math.isfinite(r.get("env/all/reward/total", 0.0)) for r in train_rows)
    # Sampler and trainer logprobs agree (the cookbook's own health threshold is 0.01) for
    # every step trained on samples from the current weights. In async mode a step may train
    # on samples from up to max_steps_off_policy steps ago; then the KL measures real policy
    # drift, not a disagreement, and only has to be small and finite.
    lags = [0] * len(train_rows)
    staleness = None
    if mode == "async":
        lag = [r["training_client/step"] - r["sampling_client/step_min"] for r in train_rows
               if "sampling_client/step_min" in r and "training_client/step" in r]
        assert lag, f"async rows lack sampling_client/step_min: {train_rows[0].keys()}"
        assert max(lag) <= 2, f"staleness bound max_steps_off_policy=2 broken: {lag}"
        staleness = max(lag)
        lags = [r.get("training_client/step", 0) - r.get("sampling_client/step_min", 0) for r in train_rows]
    for lag_i, x, x2 in zip(lags, kl, kl2):
        bound = 0.01 if lag_i == 0 else 0.5
        assert abs(x) < bound and 0 <= x2 < bound, f"kl_sample_train_v1 {kl}, v2 {kl2}, staleness {lags}"
    ck = read_jsonl(log / "checkpoints.jsonl")
    check_checkpoints(ck)
    assert sum(1 for r in ck if _is_final(r)) == 1, ck
    assert_paths_exist(loops_url, ck)
    _report(f"math_rl/{mode}/{loss_fn}", kl_sample_train_v1=[round(x, 6) for x in kl],
            entropy=[round(x, 3) for x in ent], max_staleness=staleness,
            reward=[round(r.get("env/all/reward/total", float("nan")), 3) for r in train_rows],
            seconds=round(took))


# ----------------------------------------------------------------------------- rl_loop

RL_LOOP = [arg for arg in MODEL if not arg.startswith("renderer_name=")] + [
    "batch_size=4", "group_size=4", "max_tokens=8", "learning_rate=1e-3", "save_every=0",
    "max_steps=3", "ttl_seconds=3600",
]


def _rl_loop(recipe_env, tmp_path, loss_fn: str) -> tuple[Path, float]:
    log = _log_dir(tmp_path, f"rl_loop-{loss_fn}")
    log.mkdir(parents=True, exist_ok=True)
    env = dict(recipe_env, PYTHONPATH=os.pathsep.join(filter(None, [str(Path(__file__).parent), recipe_env.get("PYTHONPATH")])))
    took = run_recipe("rl_loop_offline", RL_LOOP + [f"loss_fn={loss_fn}"], env, log)
    return log, took


def test_rl_loop_gspo(recipe_env, loops_url, tmp_path):
    """rl_loop (tinker-cookbook 0.6.1's minimal RL loop) with loss_fn=gspo: every step samples,
    builds its datums with a sequence_ratio_mask over the sampled tokens, trains and steps;
    the final checkpoint is saved (see rl_loop_offline.py for what is replaced)."""
    log, took = _rl_loop(recipe_env, tmp_path, "gspo")
    rows = [r for r in read_jsonl(log / "metrics.jsonl") if "progress/batch" in r]
    assert [r["progress/batch"] for r in rows] == [0, 1, 2], rows
    out = (log.parent / f"{log.name}.stdout.txt").read_text()
    assert "skipping training step" not in out, "a step had all advantages zero and trained nothing"
    assert all("optim/lr" in r and math.isfinite(r["reward/total"]) for r in rows), rows
    ck = read_jsonl(log / "checkpoints.jsonl")
    assert [r["name"] for r in ck] == ["final"], ck
    assert_paths_exist(loops_url, ck)
    _report("rl_loop/gspo", reward=[round(r["reward/total"], 3) for r in rows], seconds=round(took))


def test_rl_loop_default_stable_reinforce_is_refused_with_the_reason(recipe_env, tmp_path):
    """rl_loop's default loss is stable_reinforce, whose objective Tinker does not publish:
    its first forward_backward is refused with a 400 that says why and names gspo."""
    log = _log_dir(tmp_path, "rl_loop-stable_reinforce")
    log.mkdir(parents=True, exist_ok=True)
    env = dict(recipe_env, PYTHONPATH=str(Path(__file__).parent))
    with pytest.raises(AssertionError) as excinfo:
        run_recipe("rl_loop_offline", RL_LOOP, env, log)
    out = (log.parent / f"{log.name}.stdout.txt").read_text()
    assert "stable_reinforce is not supported by Loops" in out and "loss_fn=gspo" in out, str(excinfo.value)[-3000:]
