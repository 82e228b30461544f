"""The first hour of a new user with `loops cookbook run`, against a server whose workspace
policy allows one live run (max_concurrent_runs: 1), as a small deployment would:

- a finished recipe ends its session, so the next recipe can start at once (no 429 for the
  5-minute session TTL);
- a request the server refuses is exit code 4 with the server's own words, not a traceback;
- the recipes use the tinker 0.38 forms (no FutureWarning from the SDK's deprecated ones);
- with no network and HF_HUB_OFFLINE unset, a cached tokenizer is used offline (no hub
  retries, which cost about 150 s a call)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from loops_server import running_server  # noqa: E402

KEY = "tml-first-hour"


@pytest.fixture(scope="module")
def one_run_url(loops_bin, tmp_path_factory):
    policy = tmp_path_factory.mktemp("policy") / "policy.yaml"
    policy.write_text("default:\n  max_concurrent_runs: 1\n")
    with running_server("first-hour", ["--workspace-policy", str(policy)]) as server:
        yield server.url


def cookbook_run(loops_bin, url, tmp_path, name, *overrides, env=None):
    e = {k: v for k, v in (env or os.environ).items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    return subprocess.run([str(loops_bin), "cookbook", "run", "sft_chat", "steps=2", f"log_dir={tmp_path / name}",
                           *overrides, "--url", url, "--api-key", KEY],
                          capture_output=True, text=True, timeout=600, env=e)


def test_recipes_back_to_back_under_one_live_run(loops_bin, one_run_url, tmp_path):
    for i in range(2):
        p = cookbook_run(loops_bin, one_run_url, tmp_path, f"run{i}")
        assert p.returncode == 0, p.stderr[-3000:]
        assert "FutureWarning" not in p.stderr, p.stderr[-3000:]
        # HF_HUB_OFFLINE was unset and the hub is unreachable here: the cached tokenizer is
        # used offline instead of retrying the hub.
        assert "Retrying in" not in p.stderr and "thrown while requesting" not in p.stderr, p.stderr[-3000:]


def test_a_refused_request_is_exit_code_4_with_the_servers_reason(loops_bin, one_run_url, tmp_path):
    import tinker

    # A live run of the same workspace holds its one slot.
    service = tinker.ServiceClient(base_url=one_run_url, api_key=KEY)
    holder = service.create_lora_training_client(base_model="loops/tiny", rank=4)
    holder = holder.result() if hasattr(holder, "result") else holder
    try:
        p = cookbook_run(loops_bin, one_run_url, tmp_path, "refused")
        assert p.returncode == 4, (p.returncode, p.stderr[-3000:])
        assert "Traceback" not in p.stderr, p.stderr[-3000:]
        assert "the server refused a request (429" in p.stderr and "max_concurrent_runs" in p.stderr, p.stderr[-3000:]
    finally:
        close = getattr(service, "close", None)
        if close:
            close("success").result()
    p = cookbook_run(loops_bin, one_run_url, tmp_path, "after")
    assert p.returncode == 0, p.stderr[-3000:]
