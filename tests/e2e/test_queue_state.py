"""The queue state a pending request reports reaches the tinker SDK (issue 25, item 3).

A server of its own runs with a workspace policy of sampling_concurrency 1 and a short
long-poll, so a sample that waits for the workspace's one sampling slot is answered
try_again with queue_state paused_rate_limit and the scheduler's reason, which the SDK's
sampling client logs ("Sampling is paused … Reason: …").
"""

from __future__ import annotations

import logging
import time

import tinker
from tinker import types

from conftest import BASE_MODEL
from loops_server import running_server


def test_sdk_shows_why_a_sample_waits(tmp_path, caplog):
    policy = tmp_path / "policy.yaml"
    policy.write_text("default: {sampling_concurrency: 1}\n")
    with running_server("queue-state", ["--workspace-policy", str(policy), "--long-poll", "100ms"]) as srv:
        service = tinker.ServiceClient(base_url=srv.url)
        sampler = service.create_sampling_client(base_model=BASE_MODEL).result()
        prompt = types.ModelInput.from_ints([65, 66, 67])
        # One long sample holds the workspace's only sampling slot (the SDK sends it on its
        # own thread: give it the time to arrive first).
        long = sampler.sample(prompt, 64, types.SamplingParams(max_tokens=512, temperature=1.0, seed=1))
        time.sleep(0.5)
        with caplog.at_level(logging.WARNING, logger="tinker"):
            short = sampler.sample(prompt, 1, types.SamplingParams(max_tokens=4, temperature=1.0, seed=2))
            out = short.result()
        long.result()
    assert len(out.sequences) == 1
    paused = [r.getMessage() for r in caplog.records if "Sampling is paused" in r.getMessage()]
    assert paused, f"the SDK logged no paused queue state; log: {caplog.text}"
    assert "sampling_concurrency" in paused[0], paused[0]
