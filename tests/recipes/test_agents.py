"""The agent recipes end to end on loops/tiny (few steps): their tools and sandboxes really
run what the policy writes. A random 3M model passes no hidden test and solves no task, so
their learning is a GPU-model exercise (cookbook/README.md); what is asserted here is that
every episode went through the tool/sandbox path and the run completed with checkpoints."""

from __future__ import annotations

from conftest import Estimated, report

# Each run is first estimated with `loops cookbook check --estimate --pilot 1` (its first RL
# step run for real, the rest extrapolated): the estimate must be within ±10% of what the
# run itself is metered (docs/operations.md, "Estimates").
PILOT = 1


def estimated_run(loops_bin, loops_url, recipe_env, tmp_path, name, *overrides):
    est = Estimated(loops_bin, loops_url, recipe_env, tmp_path, name, PILOT, *overrides)
    assert est.pilot_cost > 0 and est.low <= est.estimate <= est.high, est.output
    assert abs(est.ratio - 1) <= 0.10, (name, est.estimate, est.metered, est.output)
    return est.result


def test_tool_calling_sft_then_rl(loops_bin, loops_url, recipe_env, tmp_path):
    res = estimated_run(loops_bin, loops_url, recipe_env, tmp_path, "tool_calling", "sft_steps=8", "steps=2", "max_tokens=32",
                        "group_size=2", "eval_tasks=2")
    sft = [r for r in res.metrics if r.get("phase") == "sft"]
    rl = [r for r in res.metrics if "reward" in r]
    assert [r["step"] for r in sft] == list(range(1, 9)) and [r["step"] for r in rl] == [9, 10]
    assert sft[-1]["train_loss"] < sft[0]["train_loss"], "SFT on the transcripts did not lower the loss"
    for r in rl:
        assert {"valid_call", "tool_calls_executed", "correct", "answered"} <= r.keys()
    assert res.checkpoints[-1]["name"] == "final" and res.checkpoints[-1]["step"] == 10
    ev = res.summary["eval"]  # the final checkpoint through the OpenAI route with tools
    assert ev["tasks"] == 2 and 0 <= ev["correct"] <= 2 and 0 <= ev["answers_with_tool_calls"] <= 2 * 3, ev
    assert ev["calls_run"] == 0 or ev["answers_with_tool_calls"] > 0, ev
    report("tool_calling", eval=ev, sft_loss_first=sft[0]["train_loss"], sft_loss_last=sft[-1]["train_loss"],
           rl_rewards=[r["reward"] for r in rl], valid_call=[r["valid_call"] for r in rl], seconds=round(res.seconds, 1))


def test_coding_agent_runs_every_solution_in_the_sandbox(loops_bin, loops_url, recipe_env, tmp_path):
    res = estimated_run(loops_bin, loops_url, recipe_env, tmp_path, "coding_agent", "steps=2", "max_tokens=48")
    assert "sandbox: bwrap" in res.output or "WEAK fallback" in res.output
    for r in res.metrics:
        assert r["sandbox_runs"] == 1.0, r  # every episode's code was executed
        assert 0.0 <= r["reward"] <= 1.0
    assert res.summary["sandbox_runs"] == 2 * 4 * 4
    report("coding_agent", rewards=[r["reward"] for r in res.metrics], seconds=round(res.seconds, 1))


def test_sandboxed_agent_runs_end_to_end(loops_bin, loops_url, recipe_env, tmp_path):
    res = estimated_run(loops_bin, loops_url, recipe_env, tmp_path, "sandboxed_agent", "steps=2", "max_tokens=48", "max_turns=2",
                        "group_size=2")
    for r in res.metrics:
        assert {"solved", "commands", "commands_ok"} <= r.keys()
        assert 1.0 <= r["turns"] <= 2.0
    report("sandboxed_agent", rewards=[r["reward"] for r in res.metrics], seconds=round(res.seconds, 1))
