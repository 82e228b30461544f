"""The recipes' parts that decide rewards, driven by scripted policies (no training): tools,
the sandbox, the coding harness, the agent's final-state check, DPO's gradient, the RL data."""

from __future__ import annotations

import json
import math
import os

import pytest
from conftest import COOKBOOK

from loops_cookbook import sandbox, tools
from loops_cookbook.chat import ChatML, template_matches
from loops_cookbook.config import sample_data
from loops_cookbook.env import Episode
from loops_cookbook.recipes import coding_agent, dpo, sandboxed_agent, tool_calling


@pytest.fixture(scope="module")
def chat(loops_url):
    # loops serve has written loops/tiny into the local HF cache.
    from transformers import AutoTokenizer

    return ChatML(AutoTokenizer.from_pretrained("loops/tiny"))


def test_sandbox_isolates_and_limits():
    ok, detail = sandbox.self_test()
    assert ok, detail
    if os.environ.get("CI") == "true":
        assert sandbox.detect_mode() == "bwrap", "CI installs bubblewrap (.ci/run); the fallback must not be silent"
    with sandbox.Sandbox(time_limit=2) as sb:
        if sb.mode == "bwrap":
            r = sb.run_shell(f"ls {COOKBOOK} 2>&1; echo x > /etc/probe 2>&1 || echo ro")
            assert "registry" not in r.stdout and "ro" in r.stdout, r
        r = sb.run_shell("echo hi > f.txt; cat f.txt")
        assert r.ok and r.stdout == "hi\n" and sb.read("f.txt") == "hi\n"
        assert sb.read("../../etc/passwd") is None
    assert not sb.dir.exists()


def test_chat_template_matches_and_turns_extend(chat):
    ok, detail = template_matches(chat.tok)
    assert ok, detail
    msgs = [{"role": "user", "content": "hi"}]
    prompt = chat.prompt(msgs)
    assert chat.tok.decode(prompt) == ChatML.text(msgs, add_generation_prompt=True)
    action = chat.encode("ok") + [chat.end]
    nxt = chat.continuation(action, [{"role": "tool", "content": "{}"}])
    whole = msgs + [{"role": "assistant", "content": "ok"}, {"role": "tool", "content": "{}"}]
    assert chat.tok.decode(prompt + action + nxt) == ChatML.text(whole, add_generation_prompt=True)


def test_tool_env_executes_calls_and_rewards_the_answer(chat):
    rec = json.loads(open(sample_data("tool_tasks.jsonl")).readline())
    transcript = json.loads(open(sample_data("tool_transcripts.jsonl")).readline())["messages"]
    assert transcript[1]["content"] == rec["question"]
    env = tool_calling.ToolEnv(tool_calling.Config(), chat, rec)
    env.reset()
    st = env.step(chat.encode(transcript[2]["content"]) + [chat.end])
    assert not st.done and st.metrics["tool_calls_executed"] == 1 and st.metrics["valid_call"] == 1
    assert transcript[3]["content"] in chat.tok.decode(st.next_tokens)  # the tool's real result came back
    st = env.step(chat.encode(transcript[4]["content"]) + [chat.end])
    assert st.done and st.reward == pytest.approx(1.2)
    env = tool_calling.ToolEnv(tool_calling.Config(), chat, rec)
    env.reset()
    st = env.step(chat.encode("Answer: wrong") + [chat.end])
    assert st.done and st.reward == 0.0
    assert tools.execute("calculator", {"expression": "__import__('os')"})[0] is False
    assert tools.calculator("(2 + 3) * 4") == "20"


def test_coding_harness_scores_pass_share():
    rec = {"entry_point": "add", "tests": ["assert add(1, 2) == 3", "assert add(0, 0) == 0", "assert add(2, 2) == 4",
                                            "assert add(-1, 1) == 0"]}
    assert coding_agent.score("def add(a, b):\n    return a + b\n", rec, 5, 512)[0] == 1.0
    assert coding_agent.score("def add(a, b):\n    return 0\n", rec, 5, 512)[0] == 0.5
    r, m = coding_agent.score("def add(a, b):\n    while True:\n        pass\n", rec, 2, 512)
    assert r == 0.0 and m["timeouts"] == 1.0
    assert coding_agent.score("import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=1)\n"
                              "def add(a, b):\n    return a + b\n", rec, 5, 512)[0] == (0.0 if sandbox.detect_mode() != "plain" else 1.0)
    assert coding_agent.score("x = bytearray(2 << 30)\ndef add(a, b):\n    return a + b\n", rec, 5, 256)[0] == 0.0
    assert coding_agent.extract_code("Here:\n```python\ndef f():\n    return 1\n```\nDone") == "def f():\n    return 1\n"


def test_agent_env_reward_comes_from_the_final_state(chat):
    recs = [json.loads(line) for line in open(sample_data("agent_tasks.jsonl"))]
    rec = next(r for r in recs if "data.txt" in r.get("files", {}))
    cfg = sandboxed_agent.Config()
    env = sandboxed_agent.AgentEnv(cfg, chat, rec)
    env.reset()
    st = env.step(chat.encode("```sh\nwc -l < data.txt > count.txt\n```") + [chat.end])
    assert not st.done and "exit 0" in chat.tok.decode(st.next_tokens)
    st = env.step(chat.encode("DONE") + [chat.end])
    assert st.done and st.reward == pytest.approx(1.0 + cfg.command_reward) and st.metrics["solved"] == 1.0
    env.close()
    env = sandboxed_agent.AgentEnv(cfg, chat, rec)
    env.reset()
    st = env.step(chat.encode("DONE") + [chat.end])
    assert st.done and st.reward == 0.0
    env.close()


def test_dpo_gradient_matches_finite_differences():
    beta = 0.5
    lp, ref = [-3.0, -2.0, -1.0, -4.0], [-2.5, -2.5, -2.0, -2.0]

    def loss(lp):
        total = 0.0
        for i in range(0, len(lp), 2):
            z = beta * ((lp[i] - ref[i]) - (lp[i + 1] - ref[i + 1]))
            total += math.log(1 + math.exp(-z))
        return total / (len(lp) // 2)

    scales, m = dpo.dpo_terms(lp, ref, beta)
    assert m["dpo_loss"] == pytest.approx(loss(lp))
    assert m["accuracy"] == 0.5
    eps = 1e-6
    for j in range(4):
        bumped = list(lp)
        bumped[j] += eps
        grad = (loss(bumped) - loss(lp)) / eps * 2  # dpo_terms' weights are per pair, not averaged
        sign = 1.0 if j % 2 == 0 else -1.0
        # cross_entropy's loss is −Σ w·lp, so the weight that reproduces the gradient is −grad.
        assert sign * scales[j // 2] == pytest.approx(-grad, rel=1e-4)


def test_rl_advantages_are_group_relative_on_action_tokens():
    from loops_cookbook.rl import datums

    def ep(reward):
        return Episode(tokens=[1, 2, 3, 4], logprobs=[0, 0, -0.5, -0.7], mask=[0, 0, 1, 1], reward=reward)

    data = datums([ep(1.0), ep(0.0), ep(0.0), ep(1.0)])
    assert len(data) == 4
    assert data[0].loss_fn_inputs["advantages"].tolist() == [0.0, 0.5, 0.5]
    assert data[1].loss_fn_inputs["advantages"].tolist() == [0.0, -0.5, -0.5]
    assert data[0].loss_fn_inputs["target_tokens"].tolist() == [2, 3, 4]
    assert data[0].loss_fn_inputs["logprobs"].tolist() == pytest.approx([0.0, -0.5, -0.7])
    assert datums([ep(1.0), ep(1.0)]) == []
