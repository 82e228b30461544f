"""`loops cookbook check|run` for real: the Go command extracts the embedded cookbook, builds
its cached venv (scripts/pyenv.sh, pip install of cookbook/), checks against `loops serve` and
runs a recipe with the run id and where to watch it printed."""

from __future__ import annotations

import json
import re
import subprocess

from conftest import API_KEY, report


def loops(loops_bin, url, *args, timeout=600):
    return subprocess.run([str(loops_bin), *args, "--url", url, "--api-key", API_KEY],
                          capture_output=True, text=True, timeout=timeout)


def test_cookbook_check_then_run(loops_bin, loops_url, recipe_env, tmp_path):
    p = loops(loops_bin, loops_url, "cookbook", "check", "coding_agent")
    assert p.returncode == 0, p.stdout + p.stderr
    for row in ("server reachable", "API key", "base model", "LoRA rank", "data data", "tokenizer", "chat template",
                "sequence length", "sandbox"):
        assert re.search(rf"^{row}\s+PASS", p.stdout, re.M), (row, p.stdout)
    assert "max sequence length" in p.stdout

    p = loops(loops_bin, loops_url, "cookbook", "check", "sft_chat", "model=no/such-model")
    assert p.returncode == 1 and re.search(r"^base model\s+FAIL\s+no/such-model is not allowed", p.stdout, re.M), p.stdout

    log_dir = tmp_path / "cli-run"
    p = loops(loops_bin, loops_url, "cookbook", "run", "rl_async", "steps=3", "groups_per_batch=4", f"log_dir={log_dir}")
    assert p.returncode == 0, p.stderr[-4000:]
    summary = json.loads(p.stdout.strip().splitlines()[-1])
    run_id = summary["run_id"]
    assert f"watch it: loops runs show {run_id}" in p.stderr
    assert f"the console at {loops_url}/" in p.stderr
    assert "rl_async: 100%" in p.stderr  # the progress bar reached the end
    assert len((log_dir / "metrics.jsonl").read_text().splitlines()) == 3

    shown = subprocess.run([str(loops_bin), "runs", "show", run_id, "--url", loops_url, "--api-key", API_KEY],
                           capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0 and run_id in shown.stdout, shown.stdout + shown.stderr

    p = loops(loops_bin, loops_url, "cookbook", "run", "sft_chat", f"train_data={tmp_path / 'missing.jsonl'}")
    assert p.returncode == 3, (p.returncode, p.stderr[-2000:])
    p = loops(loops_bin, loops_url, "cookbook", "run", "no_such_recipe")
    assert p.returncode == 2
    report("cookbook_cli", run_id=run_id)


def test_cookbook_check_estimate_matches_the_metered_run(loops_bin, loops_url, recipe_env, tmp_path):
    """`check --estimate` on sft_chat under the session's price sheet against what its run is
    metered (within ±10%; SFT's items are known before the run, so it is exact), and without
    a sheet a failed row that says no prices are configured. An agent recipe without
    --pilot says it needs one."""
    import sys

    from conftest import COOKBOOK, workspace_cost
    from loops_server import running_server

    py = ["--python", sys.executable, "--cookbook-dir", str(COOKBOOK)]
    recipe = ["sft_chat", "steps=6", "eval_every=3", "seed=3"]
    with running_server("no-prices", ["--log-level", "info"]) as server:  # its own server, with no --prices
        p = loops(loops_bin, server.url, "cookbook", "check", *recipe, "--estimate", *py)
    assert p.returncode == 1 and re.search(r"^cost estimate\s+FAIL\s+.*no prices are configured", p.stdout, re.M), p.stdout

    p = loops(loops_bin, loops_url, "cookbook", "check", "sandboxed_agent", "--estimate", *py)
    assert p.returncode == 1 and re.search(r"^cost estimate\s+FAIL\s+.*estimate it with a pilot \(--pilot K", p.stdout, re.M), p.stdout

    p = loops(loops_bin, loops_url, "cookbook", "check", *recipe, "--estimate", *py)
    assert p.returncode == 0, p.stdout + p.stderr
    estimated = float(re.search(r"^cost estimate\s+PASS\s+\$([0-9.]+)", p.stdout, re.M).group(1))
    before = workspace_cost(loops_bin, loops_url)
    p = subprocess.run([sys.executable, "-m", "loops_cookbook", "run", *recipe, f"log_dir={tmp_path / 'run'}", "progress=false"],
                       env=recipe_env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-4000:]
    metered = workspace_cost(loops_bin, loops_url) - before
    report("cookbook_estimate", recipe="sft_chat", estimated_usd=estimated, metered_usd=metered, ratio=estimated / metered)
    assert abs(estimated / metered - 1) <= 0.10, (estimated, metered, p.stdout)
