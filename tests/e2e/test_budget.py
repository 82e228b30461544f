"""Budgets end to end, with the real tinker SDK (docs/operations.md "Budgets").

A server with a price sheet (training at 1 USD per million tokens) and a workspace policy
whose budget_usd_total fits exactly two forward_backward steps of 7 tokens. An unmodified
tinker training script that loops over steps trains twice, then its third forward_backward
is refused: the SDK raises the server's message unchanged (it names budget_usd_total, what
was spent and how to raise it) and the script fails at once, not after minutes of the
SDK's retries: Tinker's routes answer a budget refusal 403 (reason BUDGET_EXCEEDED), since
the SDK retries a 429 on forward_backward for 5 minutes whatever X-Should-Retry says and
pauses on a 402 (billing) for an hour. The workspace's spend then shows the alerts it
crossed (50% and 100% of the budget) in `loops workspace` and in the audit log.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from loops_server import loops_binary, running_server

KEY = "tml-e2e-budget"
OPERATOR_KEY = "tml-e2e-budget-operator"

SCRIPT = """
import tinker
from tinker import types

service = tinker.ServiceClient()
tc = service.create_lora_training_client(base_model="loops/tiny", rank=4)
tokens = [5, 6, 7, 8, 9, 10, 11, 12]
datum = types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                    loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * 7})
for step in range(100):
    tc.forward_backward([datum], "cross_entropy").result(timeout=120)
    tc.optim_step(types.AdamParams(learning_rate=1e-3)).result(timeout=120)
    print("STEP", step, flush=True)
"""


@pytest.fixture(scope="module")
def server():
    tmp = Path(tempfile.mkdtemp(prefix="loops-budget-"))
    prices = tmp / "prices.yaml"
    prices.write_text('models:\n  "*": {train: "1"}\n')
    policy = tmp / "policy.yaml"
    # Two steps of 7 tokens cost 0.000014 USD; a third would bring it to 0.000021.
    policy.write_text('workspaces:\n  budget-ws:\n    budget_usd_total: "0.00002"\n')
    args = ["--prices", str(prices), "--workspace-policy", str(policy),
            "--api-key", f"{KEY}=budget-ws", "--operator-key", OPERATOR_KEY]
    with running_server("budget", args) as s:
        yield s.url


def loops(url: str, key: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(loops_binary()), *args, "--url", url, "--api-key", key],
                          capture_output=True, text=True, timeout=60)


def test_sdk_fails_fast_at_the_budget(server):
    env = dict(os.environ, TINKER_BASE_URL=server, TINKER_API_KEY=KEY)
    start = time.monotonic()
    p = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300, env=env)
    took = time.monotonic() - start
    print(f"\nbudget refusal: the script failed after {took:.1f}s, stdout {p.stdout.split()}")
    assert p.returncode != 0, p.stdout
    assert p.stdout.split() == ["STEP", "0", "STEP", "1"], p.stdout + p.stderr[-3000:]
    err = p.stderr
    assert "PermissionDeniedError" in err and "403" in err and "BUDGET_EXCEEDED" in err, err[-3000:]
    assert 'workspace "budget-ws" has spent 0.000014 USD in all' in err, err[-3000:]
    assert "of its budget of 0.00002 USD (budget_usd_total in its policy)" in err, err[-3000:]
    assert "estimated cost, 0.000007 USD, would pass it" in err, err[-3000:]
    assert "ask an operator to raise budget_usd_total in the workspace policy" in err, err[-3000:]
    # A 429 would be retried for 5 minutes, a 402 paused on for an hour; the 403 fails at once (the two steps before
    # it and the client's start included).
    assert took < 60, f"the SDK retried the budget refusal for {took:.0f}s"

    # The alerts crossed: 50% (the second step brought the spend to 70%; 80% was never
    # reached) and 100% (the budget refused work), each written once to the audit log.
    ws = loops(server, KEY, "workspace")
    assert ws.returncode == 0, ws.stderr
    assert "budget_usd_total" in ws.stdout, ws.stdout
    assert "0.000014 of 0.00002 USD spent, 0 running; alerts: 50%, 100%" in ws.stdout, ws.stdout
    deadline = time.monotonic() + 30  # written to the audit log in the background
    while True:
        audit = loops(server, KEY, "audit", "--resource", "budget")
        assert audit.returncode == 0, audit.stderr
        alerts = sorted(line for line in audit.stdout.splitlines() if "budget_alert" in line)
        if len(alerts) >= 2 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert len(alerts) == 2, audit.stdout[-3000:]
    assert "budget_usd_total 50%" in alerts[0] + alerts[1] and "budget_usd_total 100%" in alerts[0] + alerts[1], alerts
