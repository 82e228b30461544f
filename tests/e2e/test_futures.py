"""Cancelled futures and batch reads through the real SDK (issue 26, item 2).

* An abandoned sampling future: the SDK sends cancel_future (Loops turns the dynamic config's
  sample_cancel_enabled on), and a sample still queued behind the workspace's one sampling
  slot is removed without running: the server counts it cancelled, and the sample holding
  the slot finishes as usual.
* retrieve_futures: the SDK's own request types poll a sampling session's finished requests
  by cursor.
"""

from __future__ import annotations

import re
import time
import urllib.request

import tinker
from tinker import types
from tinker.types.futures_retrieve_request import FuturesRetrieveRequest, SamplingSessionFuturesTarget

from conftest import BASE_MODEL
from loops_server import running_server


def _finished(url: str, kind: str, state: str) -> float:
    """loops_operations_finished_total{kind, state} from the server's /metrics."""
    body = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    total = 0.0
    for line in body.splitlines():
        if line.startswith("loops_operations_finished_total{") and f'kind="{kind}"' in line and f'state="{state}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_sdk_cancels_a_queued_sample(tmp_path):
    policy = tmp_path / "policy.yaml"
    policy.write_text("default: {sampling_concurrency: 1}\n")
    with running_server("futures-cancel", ["--workspace-policy", str(policy), "--long-poll", "200ms"]) as srv:
        service = tinker.ServiceClient(base_url=srv.url)
        sampler = service.create_sampling_client(base_model=BASE_MODEL).result()
        prompt = types.ModelInput.from_ints([65, 66, 67])
        # One long sample holds the workspace's only sampling slot; the next one waits. Long
        # enough on a quiet machine too (tens of thousands of tokens: the SDK only sends
        # cancel_future for a future still pending, i.e. a sample not yet answered).
        long = sampler.sample(prompt, 128, types.SamplingParams(max_tokens=1500, temperature=1.0, seed=1))
        time.sleep(0.5)
        queued = sampler.sample(prompt, 1, types.SamplingParams(max_tokens=4, temperature=1.0, seed=2))
        time.sleep(1.0)  # its request is sent and it polls, queued
        assert _finished(srv.url, "sample", "cancelled") == 0
        assert _finished(srv.url, "sample", "succeeded") == 0, "the long sample ended before the test could cancel behind it"
        # Abandoned: the SDK sends cancel_future for it.
        assert queued.future().cancel(), "the queued sample had already been answered"
        deadline = time.time() + 300
        while _finished(srv.url, "sample", "cancelled") < 1:
            assert time.time() < deadline, "the server never cancelled the abandoned sample"
            time.sleep(0.2)
        out = long.result()
        assert len(out.sequences) == 128
        assert _finished(srv.url, "sample", "succeeded") == 1, "the cancelled sample never ran"


def test_retrieve_futures_reports_finished_samples(service_client):
    sampler = service_client.create_sampling_client(base_model=BASE_MODEL).result()
    prompt = types.ModelInput.from_ints([72, 101])
    futs = [sampler.sample(prompt, 1, types.SamplingParams(max_tokens=2, temperature=1.0, seed=i)) for i in range(3)]
    for f in futs:
        f.result()
    session_id = sampler._sampling_session_id
    holder = sampler.holder

    async def poll(cursor: int):
        with holder.aclient(tinker.lib.client_connection_pool_type.ClientConnectionPoolType.RETRIEVE_FUTURES) as client:
            return await client.futures.retrieve_multi(
                request=FuturesRetrieveRequest(
                    target=SamplingSessionFuturesTarget(sampling_session_id=session_id),
                    prev_cursor=cursor,
                    timeout=0,
                )
            )

    first = holder.run_coroutine_threadsafe(poll(0)).result()
    assert len(first.completions) == 3
    assert {c.state for c in first.completions} == {"finished"}
    assert all(re.match(r"^op-", c.request_id) for c in first.completions)
    again = holder.run_coroutine_threadsafe(poll(first.cursor)).result()
    assert again.completions == []
    assert again.cursor == first.cursor


def test_cli_exports_a_session_trace(tmp_path, loops_url):
    """`tinker session export-trace` against loops serve: the trace it saves is Chrome trace
    event JSON with every stage of the session's operations."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    service = tinker.ServiceClient(base_url=loops_url)
    session_id = service.holder.get_session_id()
    tc = service.create_lora_training_client(base_model=BASE_MODEL, rank=4, seed=1).result()
    datum = types.Datum(
        model_input=types.ModelInput.from_ints([1, 2, 3, 4]),
        loss_fn_inputs={"target_tokens": [2, 3, 4, 5], "weights": [1.0, 1.0, 1.0, 1.0]},
    )
    tc.forward_backward([datum], "cross_entropy").result()
    tc.optim_step(types.AdamParams(learning_rate=1e-3)).result()
    sampler = service.create_sampling_client(base_model=BASE_MODEL).result()
    sampler.sample(types.ModelInput.from_ints([72, 101]), 1, types.SamplingParams(max_tokens=2)).result()

    out = tmp_path / "trace.pftrace"
    env = {**os.environ, "TINKER_BASE_URL": loops_url}
    cli = Path(sys.executable).with_name("tinker")
    res = subprocess.run([str(cli), "session", "export-trace", session_id, "--output", str(out)],
                         env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    trace = json.loads(out.read_text())
    assert trace["otherData"]["session_id"] == session_id
    events = trace["traceEvents"]
    processes = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert any(p.startswith("training run ") for p in processes), processes
    assert any(p.startswith("sampler ") for p in processes), processes
    threads = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert any("forward_backward" in t for t in threads), threads
    assert any("optim_step" in t for t in threads), threads
    assert any(t.startswith("sample ") for t in threads), threads
    stages = {e["name"] for e in events if e["ph"] == "X"}
    assert {"queued", "running", "backend", "persist", "await retrieval"} <= stages, stages
    for e in events:
        if e["ph"] == "X":
            assert e["dur"] >= 0

    # Another API key sees no such session.
    other = subprocess.run([str(cli), "session", "export-trace", session_id, "--output", str(tmp_path / "x")],
                           env={**env, "TINKER_API_KEY": "tml-another-workspace"}, capture_output=True, text=True, timeout=600)
    assert other.returncode != 0
    assert not (tmp_path / "x").exists()
