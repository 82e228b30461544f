"""`loops jobs` for real: a gateway with a workspace policy that lets one workspace run jobs,
the sft_chat recipe submitted as a job (few steps) and followed to its end, in the bubblewrap
sandbox with the cookbook's cached venv; the other workspace refused (403 naming the flag)
and blind to the job. See docs/jobs.md."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from conftest import report
from loops_server import running_server

JOBS_KEY, OTHER_KEY = "tml-jobs", "tml-nojobs"


def bwrap_works() -> bool:
    if not shutil.which("bwrap"):
        return False
    return subprocess.run(["bwrap", "--unshare-all", "--ro-bind", "/", "/", "true"], capture_output=True).returncode == 0


@pytest.fixture(scope="module")
def jobs_url(loops_bin, tmp_path_factory):
    if os.environ.get("LOOPS_E2E_URL"):
        pytest.skip("needs its own gateway with a jobs policy (LOOPS_E2E_URL is set)")
    if not bwrap_works():
        pytest.skip("bubblewrap is missing or cannot make namespaces here")
    policy = tmp_path_factory.mktemp("jobs") / "policy.yaml"
    policy.write_text("workspaces:\n  team-jobs:\n    allow_jobs: true\n    max_job_seconds: 900\n")
    old = os.environ.get("LOOPS_E2E_SERVE_ARGS")
    os.environ["LOOPS_E2E_SERVE_ARGS"] = (f"--workspace-policy {policy} --api-key {JOBS_KEY}=team-jobs "
                                          f"--api-key {OTHER_KEY}=team-other")
    try:
        with running_server("jobs") as server:
            yield server.url
    finally:
        if old is None:
            os.environ.pop("LOOPS_E2E_SERVE_ARGS", None)
        else:
            os.environ["LOOPS_E2E_SERVE_ARGS"] = old


def jobs(loops_bin: Path, url: str, key: str, sub: str, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    # The flags go before the arguments: after "--" they would be the job's.
    return subprocess.run([str(loops_bin), "jobs", sub, "--url", url, "--api-key", key, *args],
                          capture_output=True, text=True, timeout=timeout)


def test_sft_chat_as_a_job(loops_bin, jobs_url):
    p = jobs(loops_bin, jobs_url, JOBS_KEY, "submit", "--recipe", "sft_chat", "-f", "--", "steps=4", "eval_every=0")
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
    job_id = re.search(r"job (job-[0-9a-f]{16}) started", p.stderr).group(1)
    summary = json.loads([line for line in p.stdout.splitlines() if line.startswith('{"recipe"')][-1])
    assert summary["recipe"] == "sft_chat"
    assert summary["eval_loss_end"] < summary["eval_loss_start"], summary
    assert f"[loops: job {job_id} succeeded]" in p.stdout

    listed = jobs(loops_bin, jobs_url, JOBS_KEY, "list")
    assert listed.returncode == 0, listed.stderr
    assert re.search(rf"^{job_id}\s+succeeded\s+recipe sft_chat\b.*\s0\s+\d+", listed.stdout, re.M), listed.stdout
    logs = jobs(loops_bin, jobs_url, JOBS_KEY, "logs", job_id)
    assert logs.returncode == 0 and summary["run_id"] in logs.stdout, "the log persists after the job"

    # Another workspace: not allowed to submit (403 naming the flag), and sees none of the jobs.
    refused = jobs(loops_bin, jobs_url, OTHER_KEY, "submit", "--recipe", "sft_chat")
    assert refused.returncode != 0 and "allow_jobs: true" in refused.stderr, refused.stderr
    other = jobs(loops_bin, jobs_url, OTHER_KEY, "logs", job_id)
    assert other.returncode != 0 and "not found" in other.stderr, other.stderr
    assert job_id not in jobs(loops_bin, jobs_url, OTHER_KEY, "list").stdout
    report("jobs_sft_chat", job_id=job_id, run_id=summary["run_id"],
           eval_loss_start=summary["eval_loss_start"], eval_loss_end=summary["eval_loss_end"])


def test_script_job_cancel(loops_bin, jobs_url, tmp_path):
    (tmp_path / "wait.py").write_text(
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *_: (print('got SIGTERM', flush=True), sys.exit(0)))\n"
        "print('waiting', flush=True)\n"
        "time.sleep(600)\n")
    p = jobs(loops_bin, jobs_url, JOBS_KEY, "submit", str(tmp_path / "wait.py"))
    assert p.returncode == 0, p.stderr
    job_id = p.stdout.strip()
    deadline = time.monotonic() + 120  # the first job may wait for the venv
    while "waiting" not in jobs(loops_bin, jobs_url, JOBS_KEY, "logs", job_id).stdout:
        assert time.monotonic() < deadline, "the script never started"
        time.sleep(0.2)
    c = jobs(loops_bin, jobs_url, JOBS_KEY, "cancel", job_id)
    assert c.returncode == 0 and "cancelled" in c.stdout, c.stdout + c.stderr
    f = jobs(loops_bin, jobs_url, JOBS_KEY, "logs", job_id, "-f")
    assert f.returncode == 130, (f.returncode, f.stdout, f.stderr)
    assert "got SIGTERM" in f.stdout, "the script heard SIGTERM and stopped on its own"
    assert "cancelled by a request" in f.stdout
