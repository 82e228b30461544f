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
from decimal import Decimal
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


# The session server's price sheet: every recipe run is metered in US dollars, so the
# estimate tests compare `loops cookbook check --estimate` with the cost of the same runs.
PRICES = 'models:\n  "*": {prefill: "0.20", cached_prefill: "0.05", sample: "0.60", train: "0.40"}\n'


@pytest.fixture(scope="session")
def loops_url(loops_bin, tmp_path_factory):
    sheet = tmp_path_factory.mktemp("prices") / "prices.yaml"
    sheet.write_text(PRICES)
    with running_server("recipes", ["--prices", str(sheet)]) as server:
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


def loops_cli(loops_bin: Path, url: str, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """`loops ARGS --url URL --api-key API_KEY`."""
    return subprocess.run([str(loops_bin), *args, "--url", url, "--api-key", API_KEY],
                          capture_output=True, text=True, timeout=timeout)


def workspace_cost(loops_bin: Path, url: str) -> float:
    """What the recipes' workspace has been metered so far (loops usage --cost)."""
    import re

    p = loops_cli(loops_bin, url, "usage", "--cost", "--since", "7d")
    assert p.returncode == 0, p.stderr
    m = re.search(r"^TOTAL COST\s+([0-9.]+)", p.stdout, re.M)
    return float(m.group(1)) if m else 0.0


def other_work(url: str, samples: int = 3) -> Decimal:
    """Work of another client of the workspace (the same key, no session): a few short chat
    completions on the OpenAI route. Returns their cost by hand from the responses' usage and
    PRICES (USD per million tokens: prefill 0.20, cached prefill 0.05, sampled 0.60)."""
    import urllib.request

    cost = Decimal(0)
    for i in range(samples):
        body = {"model": "loops/tiny", "messages": [{"role": "user", "content": f"other work {i}"}], "max_tokens": 2}
        req = urllib.request.Request(url + "/oai/api/v1/chat/completions", data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json", "X-API-Key": API_KEY})
        with urllib.request.urlopen(req, timeout=60) as r:
            u = json.loads(r.read())["usage"]
        cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        cost += (Decimal("0.20") * (u["prompt_tokens"] - cached) + Decimal("0.05") * cached
                 + Decimal("0.60") * u["completion_tokens"]) / 1_000_000
    return cost


class Estimated:
    """A recipe's `check --estimate --pilot K` and then its run: the estimate, its band, the
    pilot's cost and what the run itself was metered (the workspace's cost before and after
    it; the recipe tests run one at a time). While the pilot runs, another client of the
    workspace does a little work (other_work): the pilot row must report the pilot's own
    cost, the workspace's delta less that work, to the last digit."""

    def __init__(self, loops_bin: Path, url: str, env: dict, tmp_path: Path, name: str, pilot: int, *overrides: str) -> None:
        import re

        self.name, self.pilot = name, pilot
        before = workspace_cost(loops_bin, url)
        cmd = [str(loops_bin), "cookbook", "check", name, *overrides, "progress=false", f"log_dir={tmp_path / 'pilot'}",
               "--estimate", "--pilot", str(pilot), "--python", sys.executable, "--cookbook-dir", str(COOKBOOK),
               "--url", url, "--api-key", API_KEY]
        with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
            other = other_work(url)
            out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, out + err[-4000:]
        m = re.search(r"^cost estimate\s+PASS\s+\$([0-9.]+) \(band \$([0-9.]+) to \$([0-9.]+), from (\d+) pilot steps", out, re.M)
        assert m, out
        self.estimate, self.low, self.high = float(m.group(1)), float(m.group(2)), float(m.group(3))
        self.output = out
        start = workspace_cost(loops_bin, url)
        m = re.search(r"^pilot\s+PASS\s+ran its first \d+ RL steps for real: its sessions? (?:was|were) metered \$([0-9.]+); "
                      r"the run continues from them \(not run twice\): loops cookbook run \S+ --resume \S+$", out, re.M)
        assert m, out
        self.pilot_cost = float(m.group(1))
        assert other > 0 and Decimal(m.group(1)) == Decimal(str(start)) - Decimal(str(before)) - other, (
            f"pilot row {m.group(1)}, workspace delta {start - before}, other work {other}", out)
        self.result = run_recipe(env, tmp_path, name, *overrides)
        self.metered = workspace_cost(loops_bin, url) - start
        self.ratio = self.estimate / self.metered
        report("estimate", recipe=name, pilot_steps=pilot, estimated_usd=self.estimate, band_usd=[self.low, self.high],
               metered_usd=round(self.metered, 12), ratio=round(self.ratio, 4), pilot_usd=round(self.pilot_cost, 12))
