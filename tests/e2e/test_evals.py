"""Server-side evals with the unmodified SDK: an eval created through loops.v1 REST
(/v1/evals) is attached by create_lora_training_client(user_metadata={"loops.evals": ...});
each save_weights_for_sampler is scored, and the results (per checkpoint, with its step)
appear in /v1/eval_results. The NLL score is checked against the SDK's own
compute_logprobs on the saved checkpoint."""

from __future__ import annotations

import base64
import json
import os
import time
import urllib.error
import urllib.request
import uuid

import tinker
from tinker import types

from e2e_helpers import BASE_MODEL, RESULT_TIMEOUT, encode, result, sft_batch, train_step

KEY = os.environ.get("LOOPS_E2E_API_KEY", "tml-e2e-test")


def _http(url: str, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url + path, data=data, method=method,
                                 headers={"X-Api-Key": KEY, "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def test_eval_attached_by_user_metadata_runs_on_sampler_saves(loops_url, service_client, tokenizer):
    rows = [("The quick brown", " fox jumps"), ("A stitch in", " time saves nine")]
    data = "".join(json.dumps({"prompt": encode(tokenizer, p), "completion": encode(tokenizer, c)}) + "\n" for p, c in rows)
    name = f"heldout-{uuid.uuid4().hex[:6]}"
    status, ev = _http(loops_url, "POST", "/v1/evals", {
        "name": name, "kind": "EVAL_KIND_NLL", "dataset": base64.b64encode(data.encode()).decode()})
    assert status == 200, ev
    status, bad = _http(loops_url, "POST", "/v1/evals", {
        "name": name + "-bad", "kind": "EVAL_KIND_NLL", "dataset": base64.b64encode(b'{"prompt": [1]}\n').decode()})
    assert status == 400 and "dataset line 1" in bad["message"], bad

    tc = result(service_client.create_lora_training_client(
        base_model=BASE_MODEL, rank=8, seed=3, user_metadata={"loops.evals": name}))
    first = result(tc.save_weights_for_sampler(f"e1-{name}")).path
    train_step(tc, sft_batch(tokenizer), lr=1e-2)
    second = result(tc.save_weights_for_sampler(f"e2-{name}")).path

    deadline = time.monotonic() + RESULT_TIMEOUT  # a bound for a hang
    while True:
        status, got = _http(loops_url, "GET", f"/v1/eval_results?training_run_id={tc.model_id}")
        assert status == 200, got
        results = got.get("results", [])
        if len(results) == 2 and all(r["state"] != "EVAL_RESULT_STATE_RUNNING" for r in results):
            break
        assert time.monotonic() < deadline, results
        time.sleep(0.1)
    by_path = {r["tinker_path"]: r for r in results}
    assert set(by_path) == {first, second}
    assert int(by_path[first].get("step", 0)) == 0 and int(by_path[second]["step"]) == 1

    for path in (first, second):
        r = by_path[path]
        assert r["state"] == "EVAL_RESULT_STATE_SUCCEEDED", r
        assert r["dataset_sha256"] == ev["sha256"]
        # The same sums from the SDK's compute_logprobs on the saved checkpoint.
        sc = result(service_client.create_sampling_client(model_path=path))
        total, count = 0.0, 0
        for p, c in rows:
            pt, ct = encode(tokenizer, p), encode(tokenizer, c)
            lps = result(sc.compute_logprobs(types.ModelInput.from_ints(pt + ct)))
            total -= sum(lps[-len(ct):])
            count += len(ct)
        assert abs(r["score"] - total / count) < 1e-6, (r, total / count)
        assert r["metrics"]["tokens"] == count
