"""A pilot's steps are not paid twice: `loops cookbook check --estimate --pilot K` leaves a
resumable checkpoint in its log folder, and `run NAME --resume DIR` continues the run from
it. The resumed run logs exactly the metrics an uninterrupted run of the same seed logs
(sampling is seeded and the reference engine deterministic, so every figure is compared,
the wall-clock `time` aside), and the pilot and the resumed run together are metered what
the uninterrupted run is. The same resume continues a run interrupted after a save_every
checkpoint."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

from conftest import COOKBOOK, RECIPE_TIMEOUT, loops_cli, report, run_recipe, workspace_cost


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
    start = workspace_cost(loops_bin, loops_url)
    whole = run_recipe(recipe_env, tmp_path, "rl_async", *cfg)
    whole_cost = workspace_cost(loops_bin, loops_url) - start

    pilot_dir = tmp_path / "pilot"
    py = ["--python", sys.executable, "--cookbook-dir", str(COOKBOOK)]
    start = workspace_cost(loops_bin, loops_url)
    p = loops_cli(loops_bin, loops_url, "cookbook", "check", "rl_async", *cfg, f"log_dir={pilot_dir}",
                  "--estimate", "--pilot", "1", *py)
    assert p.returncode == 0, p.stdout + p.stderr[-4000:]
    assert re.search(rf"^pilot\s+PASS\s+.*loops cookbook run rl_async --resume {re.escape(str(pilot_dir))}$", p.stdout, re.M), p.stdout
    assert len(rows(pilot_dir)) == 1
    p = loops_cli(loops_bin, loops_url, "cookbook", "run", "rl_async", "--resume", str(pilot_dir), *py)
    assert p.returncode == 0, p.stderr[-4000:]
    assert "resumed after step 1" in p.stderr
    both_cost = workspace_cost(loops_bin, loops_url) - start

    assert rows(pilot_dir) == rows(whole.log_dir)
    assert json.loads(p.stdout.strip().splitlines()[-1])["rewards"] == whole.summary["rewards"]
    report("resume", recipe="rl_async", whole_usd=round(whole_cost, 12), pilot_and_resumed_usd=round(both_cost, 12))
    # the pilot and the resumed run share no prompt the other could have cached: equal
    assert both_cost > 0 and abs(both_cost - whole_cost) < 1e-9, (both_cost, whole_cost)


def test_tool_calling_pilot_then_resume_skips_the_sft_phase(loops_bin, loops_url, recipe_env, tmp_path):
    # the pilot runs the SFT phase and the first RL step; the resumed run only the rest
    cfg = ["sft_steps=2", "steps=2", "max_tokens=32", "group_size=2", "groups_per_batch=2", "eval_tasks=0", "progress=false"]
    start = workspace_cost(loops_bin, loops_url)
    whole = run_recipe(recipe_env, tmp_path, "tool_calling", *cfg)
    whole_cost = workspace_cost(loops_bin, loops_url) - start

    pilot_dir = tmp_path / "pilot"
    start = workspace_cost(loops_bin, loops_url)
    p = python_cli(recipe_env, "check", "tool_calling", *cfg, f"log_dir={pilot_dir}", "--json", "--estimate", "--pilot", "1")
    assert p.returncode == 0, p.stderr[-4000:]
    out = json.loads(p.stdout)
    assert out["resume"] == str(pilot_dir) and "estimate" in out
    checkpoint = json.loads((pilot_dir / "checkpoints.jsonl").read_text().splitlines()[-1])
    assert checkpoint["step"] == 3 and checkpoint["resume"]["phase"] == "rl" and checkpoint["resume"]["rl_step"] == 1
    p = python_cli(recipe_env, "run", "tool_calling", "--resume", str(pilot_dir))
    assert p.returncode == 0, p.stderr[-4000:]
    both_cost = workspace_cost(loops_bin, loops_url) - start

    assert rows(pilot_dir) == rows(whole.log_dir)
    assert [r.get("phase") for r in rows(pilot_dir)] == ["sft", "sft", None, None]
    report("resume", recipe="tool_calling", whole_usd=round(whole_cost, 12), pilot_and_resumed_usd=round(both_cost, 12))
    assert both_cost > 0 and abs(both_cost - whole_cost) < 1e-9, (both_cost, whole_cost)


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
