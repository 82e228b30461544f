"""tinker-cookbook recipes, unmodified, against `loops serve` (see README.md).

Starts one `loops serve` for the session (fresh data dir) unless LOOPS_E2E_URL is set.
Knobs: LOOPS_E2E_URL, LOOPS_E2E_BIN, LOOPS_E2E_KEEP, LOOPS_E2E_SERVE_ARGS,
LOOPS_COOKBOOK_KEEP=DIR (keep every recipe's log_path under DIR).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
API_KEY = "tml-cookbook"
_URL_RE = re.compile(r"http://\S+")
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
    if url := os.environ.get("LOOPS_E2E_URL"):
        yield url.rstrip("/")
        return
    tmp = Path(tempfile.mkdtemp(prefix="loops-cookbook-"))
    binary = os.environ.get("LOOPS_E2E_BIN")
    if not binary:
        binary = str(tmp / "loops")
        r = subprocess.run(["go", "build", "-o", binary, "./cmd/loops"], cwd=REPO_ROOT,
                           capture_output=True, text=True)
        if r.returncode:
            pytest.exit(f"go build failed:\n{r.stderr}", returncode=2)
    cmd = [binary, "serve", "--addr", "127.0.0.1:0", "--data-dir", str(tmp / "data")]
    cmd += shlex.split(os.environ.get("LOOPS_E2E_SERVE_ARGS", ""))
    _server_log = tmp / "server.log"
    log = open(_server_log, "w", buffering=1)
    proc = subprocess.Popen(cmd, cwd=tmp, stdout=log, stderr=subprocess.PIPE, text=True, bufsize=1)
    found: dict[str, str] = {}
    ready = threading.Event()

    def pump() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            log.write(line)
            if not ready.is_set() and (m := _URL_RE.search(line)):
                found["url"] = m.group(0).rstrip("/").rstrip(".,;")
                ready.set()
        ready.set()

    threading.Thread(target=pump, daemon=True).start()
    if not ready.wait(120) or "url" not in found:
        proc.kill()
        pytest.exit("loops serve did not start:\n" + _server_log.read_text(), returncode=2)
    sys.stderr.write(f"\n[cookbook] loops serve at {found['url']} (log {_server_log})\n")
    try:
        yield found["url"]
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        if os.environ.get("LOOPS_E2E_KEEP"):
            sys.stderr.write(f"\n[cookbook] kept {tmp}\n")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


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
