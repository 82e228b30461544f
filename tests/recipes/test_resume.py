"""A pilot's steps are not paid twice: `loops cookbook check --estimate --pilot K` leaves a
resumable checkpoint in its log folder, and `run NAME --resume DIR` continues the run from
it. The resumed run logs exactly the metrics an uninterrupted run of the same seed logs
(sampling is seeded and the reference engine deterministic, so every figure is compared,
the wall-clock `time` aside), and the pilot and the resumed run together are metered what
the uninterrupted run is: the same training and sampled tokens and the same prompt tokens,
of which the prefix cache may serve a few more or fewer (concurrent requests of one step
with the same prompt hit each other's blocks or not, by timing), and a cost that differs by
exactly the price of that split. The same resume continues a run interrupted after a save_every
checkpoint."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

from conftest import COOKBOOK, RECIPE_TIMEOUT, loops_cli, report, run_recipe

# conftest.PRICES in USD per token: a prompt token served from the cache saves this much
CACHE_SAVING = (0.20 - 0.05) / 1e6


def metered(loops_bin, url) -> dict[str, float]:
    """The workspace's usage so far by kind (`loops usage --cost` TOTAL rows) and "cost"."""
    p = loops_cli(loops_bin, url, "usage", "--cost", "--since", "7d")
    assert p.returncode == 0, p.stderr
    out = {k: float(n) for k, n in re.findall(r"^TOTAL\s+([a-z_]+)\s+(\d+)", p.stdout, re.M)}
    m = re.search(r"^TOTAL COST\s+([0-9.]+)", p.stdout, re.M)
    out["cost"] = float(m.group(1)) if m else 0.0
    return out


def since(before: dict, after: dict) -> dict:
    return {k: after.get(k, 0.0) - before.get(k, 0.0) for k in set(before) | set(after)}


def assert_same_cost(recipe: str, whole: dict, both: dict) -> None:
    """Pilot + resumed run against the uninterrupted run: the same tokens of every kind
    (prompt tokens cached or not together), the cost apart by the cache split's price."""
    report("resume", recipe=recipe, whole=whole, pilot_and_resumed=both)
    assert whole["cost"] > 0
    for kind in ("training_tokens", "sampling_sample_tokens"):
        assert both.get(kind) == whole.get(kind), (kind, both, whole)
    prompt = "sampling_prefill_tokens", "sampling_cached_prefill_tokens"
    assert sum(both.get(k, 0) for k in prompt) == sum(whole.get(k, 0) for k in prompt), (both, whole)
    more_cached = both.get(prompt[1], 0) - whole.get(prompt[1], 0)
    assert abs(both["cost"] - whole["cost"] + more_cached * CACHE_SAVING) < 1e-10, (both, whole)


def rows(log_dir) -> list[dict]:
    """metrics.jsonl without the wall-clock time of each row."""
    return [{k: v for k, v in json.loads(line).items() if k != "time"}
            for line in (log_dir / "metrics.jsonl").read_text().splitlines()]


def python_cli(env, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "loops_cookbook", *args], env=env, capture_output=True, text=True,
                          timeout=RECIPE_TIMEOUT)


def test_rl_async_pilot_then_resume_is_the_uninterrupted_run(loops_bin, loops_url, recipe_env, tmp_path):
    # asynchronous (staleness 1): the batch in flight when the pilot stops is saved with
    # its checkpoint and trained on by the resumed run, sampled (and billed) once
    cfg = ["steps=4", "max_staleness=1", "groups_per_batch=4", "group_size=4", "progress=false"]
    start = metered(loops_bin, loops_url)
    whole = run_recipe(recipe_env, tmp_path, "rl_async", *cfg)
    whole_usage = since(start, metered(loops_bin, loops_url))

    pilot_dir = tmp_path / "pilot"
    py = ["--python", sys.executable, "--cookbook-dir", str(COOKBOOK)]
    start = metered(loops_bin, loops_url)
    p = loops_cli(loops_bin, loops_url, "cookbook", "check", "rl_async", *cfg, f"log_dir={pilot_dir}",
                  "--estimate", "--pilot", "1", *py)
    assert p.returncode == 0, p.stdout + p.stderr[-4000:]
    assert re.search(rf"^pilot\s+PASS\s+.*loops cookbook run rl_async --resume {re.escape(str(pilot_dir))}$", p.stdout, re.M), p.stdout
    assert len(rows(pilot_dir)) == 1
    p = loops_cli(loops_bin, loops_url, "cookbook", "run", "rl_async", "--resume", str(pilot_dir), *py)
    assert p.returncode == 0, p.stderr[-4000:]
    assert "resumed after step 1" in p.stderr
    both_usage = since(start, metered(loops_bin, loops_url))

    assert rows(pilot_dir) == rows(whole.log_dir)
    assert json.loads(p.stdout.strip().splitlines()[-1])["rewards"] == whole.summary["rewards"]
    assert_same_cost("rl_async", whole_usage, both_usage)


def test_tool_calling_pilot_then_resume_skips_the_sft_phase(loops_bin, loops_url, recipe_env, tmp_path):
    # the pilot runs the SFT phase and the first RL step; the resumed run only the rest
    cfg = ["sft_steps=2", "steps=2", "max_tokens=32", "group_size=2", "groups_per_batch=2", "eval_tasks=0", "progress=false"]
    start = metered(loops_bin, loops_url)
    whole = run_recipe(recipe_env, tmp_path, "tool_calling", *cfg)
    whole_usage = since(start, metered(loops_bin, loops_url))

    pilot_dir = tmp_path / "pilot"
    start = metered(loops_bin, loops_url)
    p = python_cli(recipe_env, "check", "tool_calling", *cfg, f"log_dir={pilot_dir}", "--json", "--estimate", "--pilot", "1")
    assert p.returncode == 0, p.stderr[-4000:]
    out = json.loads(p.stdout)
    assert out["resume"] == str(pilot_dir) and "estimate" in out
    checkpoint = json.loads((pilot_dir / "checkpoints.jsonl").read_text().splitlines()[-1])
    assert checkpoint["step"] == 3 and checkpoint["resume"]["phase"] == "rl" and checkpoint["resume"]["rl_step"] == 1
    p = python_cli(recipe_env, "run", "tool_calling", "--resume", str(pilot_dir))
    assert p.returncode == 0, p.stderr[-4000:]
    both_usage = since(start, metered(loops_bin, loops_url))

    assert rows(pilot_dir) == rows(whole.log_dir)
    assert [r.get("phase") for r in rows(pilot_dir)] == ["sft", "sft", None, None]
    assert_same_cost("tool_calling", whole_usage, both_usage)


def test_resume_after_an_interruption(recipe_env, tmp_path):
    # sft_chat saves its loop state every 2 steps; a run "interrupted" after step 3 (its
    # checkpoints after step 2 gone, step 3 logged) continues from step 2 and logs the
    # same rows as the run that was not interrupted
    whole = run_recipe(recipe_env, tmp_path, "sft_chat", "steps=4", "save_every=2", "eval_every=1")
    assert [c["name"] for c in whole.checkpoints] == ["000002", "final"]
    crashed = tmp_path / "crashed"
    shutil.copytree(whole.log_dir, crashed)
    (crashed / "checkpoints.jsonl").write_text(json.dumps(whole.checkpoints[0]) + "\n")
    (crashed / "metrics.jsonl").write_text("".join(line + "\n" for line in (whole.log_dir / "metrics.jsonl").read_text().splitlines()[:3]))

    p = python_cli(recipe_env, "run", "sft_chat", "seed=1", "--resume", str(crashed))
    assert p.returncode == 2 and "seed=1 differs from the run's 0" in p.stderr, p.stderr
    p = python_cli(recipe_env, "run", "sft_chat", "progress=false", "--resume", str(crashed))
    assert p.returncode == 0, p.stderr[-4000:]
    assert "resumed after step 2" in p.stderr
    assert rows(crashed) == rows(whole.log_dir)
    assert [c["name"] for c in map(json.loads, (crashed / "checkpoints.jsonl").read_text().splitlines())] == ["000002", "final"]

    p = python_cli(recipe_env, "run", "sft_chat", "--resume", str(crashed))
    assert p.returncode == 2 and "that run finished" in p.stderr, p.stderr
    p = python_cli(recipe_env, "run", "sft_chat", "--resume", str(tmp_path / "nowhere"))
    assert p.returncode == 2 and "no config.json there" in p.stderr, p.stderr


def test_resume_point_refusals(tmp_path):
    # what --resume refuses, from the log folder alone (no server)
    import pytest

    from loops_cookbook.cli import resumed_config
    from loops_cookbook.runtime import resume_point

    def folder(*records: dict, config: dict | None = None):
        d = tmp_path / f"f{len(list(tmp_path.iterdir()))}"
        d.mkdir()
        (d / "config.json").write_text(json.dumps(config or {"steps": 4}))
        (d / "checkpoints.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        return d

    state = {"recipe": "rl_async", "phase": "rl", "rl_step": 1, "rng": [3, [0] * 625, None]}
    ok = {"name": "pilot-000001", "step": 1, "state_path": "tinker://r/weights/p", "resume": state}
    assert resume_point("rl_async", folder(ok))["step"] == 1
    # the last record with a state counts, as tinker-cookbook's get_last_checkpoint
    assert resume_point("rl_async", folder({**ok, "step": 0}, ok, {"name": "s", "sampler_path": "x"}))["step"] == 1
    cases = [
        (folder(), "no checkpoint saved yet"),
        (folder({**ok, "name": "final"}), "that run finished"),
        (folder({k: v for k, v in ok.items() if k != "resume"}), "has no loop state: rl_async cannot continue"),
        (folder({**ok, "resume": {**state, "recipe": "coding_agent"}}), "holds a coding_agent run, not rl_async"),
    ]
    for d, why in cases:
        with pytest.raises(ValueError, match=why):
            resume_point("rl_async", d)
    with pytest.raises(ValueError, match="no checkpoints.jsonl"):
        resume_point("rl_async", tmp_path)
    # the config is the run's; only what does not change the run may be overridden
    d = folder(ok, config={"steps": 4, "max_staleness": 1})
    cfg = resumed_config("rl_async", str(d), ["progress=false", "save_every=2"])
    assert (cfg.steps, cfg.max_staleness, cfg.progress, cfg.resume, cfg.log_dir) == (4, 1, False, str(d), str(d))
    with pytest.raises(ValueError, match="steps=5 differs from the run's 4"):
        resumed_config("rl_async", str(d), ["steps=5"])
    with pytest.raises(ValueError, match="fields rl_async does not"):
        resumed_config("rl_async", str(folder(ok, config={"steps": 4, "sft_steps": 2})), [])
