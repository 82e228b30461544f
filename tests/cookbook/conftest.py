"""tinker-cookbook recipes, unmodified, against `loops serve` (see README.md).

Starts one `loops serve` for the session (fresh data dir) unless LOOPS_E2E_URL is set.
Knobs: LOOPS_E2E_URL, LOOPS_E2E_BIN, LOOPS_E2E_KEEP, LOOPS_E2E_SERVE_ARGS,
LOOPS_COOKBOOK_KEEP=DIR (keep every recipe's log_path under DIR).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "tests"))
from loops_server import running_server  # noqa: E402
API_KEY = "tml-cookbook"
_server_log: Path | None = None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):  # type: ignore[no-untyped-def]
    outcome = yield
    rep = outcome.get_result()
    if rep.failed and rep.when == "call" and _server_log is not None and _server_log.exists():
        tail = "\n".join(_server_log.read_text(errors="replace").splitlines()[-60:])
        rep.sections.append(("loops server log (tail)", tail))


@pytest.fixture(scope="session")
def loops_url():
    global _server_log
    with running_server("cookbook") as server:
        _server_log = server.log_path
        yield server.url


@pytest.fixture(scope="session")
def recipe_env(loops_url):
    """What a user sets to point an unmodified cookbook at Loops, offline."""
    env = os.environ.copy()
    env.update({
        "TINKER_BASE_URL": loops_url,
        "TINKER_API_KEY": API_KEY,
        "TINKER_TELEMETRY": "0",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "WANDB_MODE": "disabled",
        "TOKENIZERS_PARALLELISM": "false",
    })
    for var in ("TINKER_CREDENTIAL_CMD", "TINKER_PROJECT_ID", "TINKER_TAGS"):
        env.pop(var, None)
    os.environ.update({k: env[k] for k in ("TINKER_BASE_URL", "TINKER_API_KEY", "TINKER_TELEMETRY",
                                           "HF_HUB_OFFLINE")})
    return env
