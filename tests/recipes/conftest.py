"""The cookbook's recipes against `loops serve` (see README.md).

One `loops serve` for the session (fresh data dir) unless LOOPS_E2E_URL is set; the loops
binary is built once and shared with the CLI tests. Recipes run as `python -m loops_cookbook
run NAME key=value ...` from the source tree (PYTHONPATH=cookbook), so what is tested is what
`loops cookbook run` installs. LOOPS_RECIPES_REPORT=FILE appends each run's figures (JSON lines).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
COOKBOOK = REPO_ROOT / "cookbook"
sys.path.insert(0, str(REPO_ROOT / "tests"))
sys.path.insert(0, str(COOKBOOK))
from loops_server import running_server  # noqa: E402

API_KEY = "tml-recipes"
RECIPE_TIMEOUT = int(os.environ.get("LOOPS_RECIPES_TIMEOUT", "400"))


@pytest.fixture(scope="session")
def loops_bin():
    """The loops binary (LOOPS_E2E_BIN, or built once into a temporary folder)."""
    if b := os.environ.get("LOOPS_E2E_BIN"):
        yield Path(b)
        return
    tmp = Path(tempfile.mkdtemp(prefix="loops-recipes-bin-"))
    out = tmp / "loops"
    p = subprocess.run(["go", "build", "-o", str(out), "./cmd/loops"], cwd=REPO_ROOT, capture_output=True, text=True)
    if p.returncode != 0:
        pytest.exit(f"go build ./cmd/loops failed:\n{p.stderr}", returncode=2)
    os.environ["LOOPS_E2E_BIN"] = str(out)
    yield out
    shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="session")
def loops_url(loops_bin):
    with running_server("recipes") as server:
        yield server.url


@pytest.fixture(scope="session")
def recipe_env(loops_url):
    env = os.environ.copy()
    env.update({"TINKER_BASE_URL": loops_url, "TINKER_API_KEY": API_KEY, "TINKER_TELEMETRY": "0",
                "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
                "PYTHONPATH": str(COOKBOOK)})
    return env


def report(name: str, **figures) -> None:
    line = json.dumps({"run": name, **figures})
    sys.stderr.write(f"\n[recipes] {line}\n")
    if out := os.environ.get("LOOPS_RECIPES_REPORT"):
        with open(out, "a") as f:
            f.write(line + "\n")


class Result:
    """A finished recipe run: its JSON summary, metrics rows and checkpoint records."""

    def __init__(self, summary: dict, log_dir: Path, output: str, seconds: float) -> None:
        self.summary = summary
        self.log_dir = log_dir
        self.output = output
        self.seconds = seconds
        self.metrics = [json.loads(line) for line in (log_dir / "metrics.jsonl").read_text().splitlines()]
        self.checkpoints = [json.loads(line) for line in (log_dir / "checkpoints.jsonl").read_text().splitlines()]


def run_recipe(env: dict, tmp_path: Path, name: str, *overrides: str) -> Result:
    """Runs a recipe to the end and asserts it exits 0 (the output is in the failure)."""
    log_dir = tmp_path / name
    cmd = [sys.executable, "-m", "loops_cookbook", "run", name, *overrides, f"log_dir={log_dir}", "progress=false"]
    t0 = time.time()
    p = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=RECIPE_TIMEOUT)
    took = time.time() - t0
    assert p.returncode == 0, f"{' '.join(cmd)}\nexit {p.returncode} after {took:.0f}s\n{p.stderr[-6000:]}"
    summary = json.loads(p.stdout.strip().splitlines()[-1])
    return Result(summary, log_dir, p.stderr, took)
