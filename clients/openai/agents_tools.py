"""Tool calls through real agent stacks: the OpenAI Agents SDK's tool loop and the Anthropic
client's tool runner drive a deployed loops/tiny checkpoint, and the official openai and
anthropic clients read its tool calls, streamed and not.

    LOOPS_URL=http://127.0.0.1:PORT LOOPS_API_KEY=tml-anything python agents_tools.py

loops/tiny is random, so the script first trains it, through the tinker SDK, to answer the
two turns of a weather agent: the first with the call
<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>, the second, once
the tool's result is in the conversation, with ANSWER. The prompts it trains on are the ones
the agent stacks send, recorded from their requests to the server with the untrained model and
rendered with transformers' apply_chat_template (tools=…): each is checked against the
server's prompt_tokens, so the server's gonja rendering of tools is transformers' token for
token. Then the agents run on the checkpoint: the Agents SDK calls the local function tool and
answers ANSWER in two turns, and so does the Anthropic tool runner. Exits 1 on any failure.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

import anthropic
import httpx2
import openai
import tinker
from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
from anthropic import beta_tool
from tinker import types

URL = os.environ["LOOPS_URL"].rstrip("/")
KEY = os.environ.get("LOOPS_API_KEY", "tml-clients-test")
BASE = "loops/tiny"
QUESTION = "What is the weather in Paris?"
ANSWER = "It is sunny in Paris."
RESULT = "Sunny, 21 C."
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
END = "<|im_end|>"
GREEDY = {"temperature": 0}

calls: list[str] = []
recorded: list[dict] = []


def check(cond: bool, what: str) -> None:
    if not cond:
        print(f"FAIL: {what}", file=sys.stderr)
        sys.exit(1)
    print(f"ok: {what}")


def weather(city: str) -> str:
    calls.append(city)
    return RESULT


@function_tool
def get_weather(city: str) -> str:
    """Get the current weather of a city."""
    return weather(city)


# The same tool for the Anthropic client: its name, description and schema as the Agents
# SDK sends them, so that both stacks send the model the same prompt.
get_weather_a = beta_tool(weather, name=get_weather.name, description=get_weather.description,
                          input_schema=get_weather.params_json_schema)


async def record(request: httpx2.Request) -> None:
    if request.method == "POST" and request.content:
        recorded.append(json.loads(request.content))


def record_sync(request: httpx2.Request) -> None:
    if request.method == "POST" and request.content:
        recorded.append(json.loads(request.content))


def text_of(content) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "\n".join(p["text"] for p in content if p.get("type") == "text")


def openai_conversation(body: dict) -> tuple[list[dict], list[dict] | None]:
    """The messages and tools of an OpenAI request as the server gives them to the chat
    template (developer as system; tool call arguments as objects; tools as
    {type, function: {name, description, parameters}})."""
    names, msgs = {}, []
    for m in body["messages"]:
        role = "system" if m["role"] == "developer" else m["role"]
        out = {"role": role, "content": text_of(m.get("content"))}
        if m.get("tool_calls"):
            out["tool_calls"] = []
            for c in m["tool_calls"]:
                names[c["id"]] = c["function"]["name"]
                out["tool_calls"].append({"id": c["id"], "type": "function", "function": {
                    "name": c["function"]["name"], "arguments": json.loads(c["function"]["arguments"] or "{}")}})
        if role == "tool":
            out["tool_call_id"] = m["tool_call_id"]
            out["name"] = names[m["tool_call_id"]]
        msgs.append(out)
    tools = None
    if body.get("tools") and body.get("tool_choice") != "none":
        tools = [{"type": "function", "function": {k: t["function"][k] for k in ("name", "description", "parameters")
                                                   if t["function"].get(k) is not None}} for t in body["tools"]]
    return msgs, tools


def anthropic_conversation(body: dict) -> tuple[list[dict], list[dict] | None]:
    """The same for an Anthropic Messages request (tool_result blocks as tool messages)."""
    names, msgs = {}, []
    if body.get("system"):
        msgs.append({"role": "system", "content": text_of(body["system"])})
    for m in body["messages"]:
        content = m["content"]
        if isinstance(content, str):
            msgs.append({"role": m["role"], "content": content})
            continue
        texts = [b["text"] for b in content if b["type"] == "text"]
        uses = [b for b in content if b["type"] == "tool_use"]
        for b in content:
            if b["type"] == "tool_result":
                msgs.append({"role": "tool", "content": text_of(b.get("content")), "tool_call_id": b["tool_use_id"],
                             "name": names[b["tool_use_id"]]})
        if m["role"] == "assistant" or texts or not any(b["type"] == "tool_result" for b in content):
            out = {"role": m["role"], "content": "\n".join(texts)}
            if uses:
                out["tool_calls"] = [{"id": u["id"], "type": "function", "function": {"name": u["name"], "arguments": u["input"]}} for u in uses]
                for u in uses:
                    names[u["id"]] = u["name"]
            msgs.append(out)
    tools = None
    if body.get("tools") and (body.get("tool_choice") or {}).get("type") != "none":
        tools = [{"type": "function", "function": {"name": t["name"], **({"description": t["description"]} if t.get("description") else {}),
                                                   "parameters": t["input_schema"]}} for t in body["tools"]]
    return msgs, tools


def with_call(msgs: list[dict]) -> list[dict]:
    """msgs followed by the assistant's call of get_weather(Paris) and the tool's result."""
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    return [*msgs, {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "content": RESULT, "tool_call_id": "call_1", "name": "get_weather"}]


async def run_agent(model: str) -> str:
    # A client per event loop: each asyncio.run has its own.
    client = openai.AsyncOpenAI(base_url=URL + "/oai/api/v1", api_key=KEY, max_retries=0,
                                http_client=httpx2.AsyncClient(event_hooks={"request": [record]}))
    agent = Agent(name="weather", tools=[get_weather],
                  model=OpenAIChatCompletionsModel(model=model, openai_client=client),
                  model_settings=ModelSettings(temperature=0, max_tokens=64))
    result = await Runner.run(agent, QUESTION, max_turns=3)
    return str(result.final_output)


def run_anthropic(client: anthropic.Anthropic, model: str) -> str:
    runner = client.beta.messages.tool_runner(model=model, max_tokens=64, extra_body=GREEDY, tools=[get_weather_a],
                                              messages=[{"role": "user", "content": QUESTION}], max_iterations=3)
    last = None
    for message in runner:
        last = message
    return "".join(b.text for b in last.content if b.type == "text")


def main() -> None:
    set_tracing_disabled(True)
    oclient = openai.OpenAI(base_url=URL + "/oai/api/v1", api_key=KEY, max_retries=0)
    aclient_a = anthropic.Anthropic(base_url=URL + "/anthropic/api", api_key=KEY, max_retries=0,
                                    http_client=httpx2.Client(event_hooks={"request": [record_sync]}))

    # 1. Record what the agent stacks send for the first turn (the untrained model answers
    #    whatever it answers; a random answer that parses as no call ends the loop).
    first = asyncio.run(run_agent(BASE))
    check(isinstance(first, str), "the Agents SDK runs against the base model")
    oai_body = recorded[0]
    recorded.clear()
    run_anthropic(aclient_a, BASE)
    ant_body = recorded[0]
    recorded.clear()
    check(oai_body.get("tools") and ant_body.get("tools"), "both stacks send tools")

    service = tinker.ServiceClient(base_url=URL, api_key=KEY)
    tc = service.create_lora_training_client(base_model=BASE, rank=16, seed=3).result(timeout=120)
    tok = tc.get_tokenizer()

    def prompt_text(msgs, tools):
        return tok.apply_chat_template(msgs, tools=tools, add_generation_prompt=True, tokenize=False)

    o_msgs, o_tools = openai_conversation(oai_body)
    a_msgs, a_tools = anthropic_conversation(ant_body)
    check(prompt_text(o_msgs, o_tools) == prompt_text(a_msgs, a_tools), "both stacks send the model the same prompt")
    first_turn = prompt_text(o_msgs, o_tools)
    second_turn = prompt_text(with_call(o_msgs), o_tools)
    # The server renders the same prompts: its prompt_tokens are transformers' token counts.
    got = oclient.chat.completions.create(model=BASE, messages=oai_body["messages"], tools=oai_body["tools"], max_tokens=1)
    check(got.usage.prompt_tokens == len(tok.encode(first_turn, add_special_tokens=False)),
          f"the server's tools prompt is transformers' ({got.usage.prompt_tokens} tokens)")
    n = aclient_a.messages.count_tokens(model=BASE, messages=ant_body["messages"], tools=ant_body["tools"]).input_tokens
    check(n == got.usage.prompt_tokens, f"the Anthropic tools prompt is the same ({n} tokens)")

    # 2. Train the two turns: the second turn's prompt is the first's, the call and the
    #    tool's result, so one sequence holds both answers.
    p1 = tok.encode(first_turn, add_special_tokens=False)
    call = tok.encode(CALL + END, add_special_tokens=False)
    p2 = tok.encode(second_turn, add_special_tokens=False)
    answer = tok.encode(ANSWER + END, add_special_tokens=False)
    check(p2[:len(p1) + len(call)] == p1 + call, "the second turn continues the first turn and its call, token for token")
    toks = p2 + answer
    weights = [0.0] * len(toks)
    for i in list(range(len(p1), len(p1) + len(call))) + list(range(len(p2), len(toks))):
        weights[i] = 1.0
    data = [types.Datum(model_input=types.ModelInput.from_ints(toks[:-1]),
                        loss_fn_inputs={"target_tokens": toks[1:], "weights": weights[1:]})]
    ntarget = len(call) + len(answer)
    t0 = time.time()
    for step in range(int(os.environ.get("LOOPS_AGENT_STEPS", "100"))):
        fb = tc.forward_backward(data, "cross_entropy")
        tc.optim_step(types.AdamParams(learning_rate=float(os.environ.get("LOOPS_AGENT_LR", "3e-3")))).result(timeout=300)
        loss = fb.result(timeout=300).metrics["loss:sum"] / ntarget
        print(f"step {step + 1}: loss {loss:.4f} per token ({time.time() - t0:.1f}s)", flush=True)
        if loss < 0.02:
            break
    check(loss < 0.1, f"trained the tool turns in {step + 1} steps, {time.time() - t0:.0f}s (loss {loss:.4f} per token)")
    path = tc.save_weights_for_sampler("agent-tools").result(timeout=120).path
    print(f"checkpoint {path}", flush=True)

    # 3. The official openai client reads the call, streamed and not.
    r = oclient.chat.completions.create(model=path, messages=oai_body["messages"], tools=oai_body["tools"], temperature=0, max_tokens=64)
    c = r.choices[0]
    check(c.finish_reason == "tool_calls" and c.message.tool_calls and c.message.tool_calls[0].function.name == "get_weather",
          f"a tool call: {c.message}")
    check(json.loads(c.message.tool_calls[0].function.arguments) == {"city": "Paris"}, "its arguments")
    name, args, finish, ids = None, "", None, set()
    for chunk in oclient.chat.completions.create(model=path, messages=oai_body["messages"], tools=oai_body["tools"], temperature=0,
                                                 max_tokens=64, stream=True):
        for ch in chunk.choices:
            for d in ch.delta.tool_calls or []:
                check(d.index == 0, "one streamed call, index 0")
                name = d.function.name or name
                args += d.function.arguments or ""
                if d.id:
                    ids.add(d.id)
            finish = ch.finish_reason or finish
    check(name == "get_weather" and json.loads(args) == {"city": "Paris"} and finish == "tool_calls" and len(ids) == 1,
          f"the streamed call: {name} {args!r} {finish}")
    named = oclient.chat.completions.create(model=path, messages=oai_body["messages"], tools=oai_body["tools"], temperature=0,
                                            max_tokens=64, tool_choice={"type": "function", "function": {"name": "get_weather"}})
    check(named.choices[0].message.tool_calls and json.loads(named.choices[0].message.tool_calls[0].function.arguments) == {"city": "Paris"}
          and named.choices[0].finish_reason == "stop",
          f"tool_choice naming the function forces the call: {named.choices[0].message}")
    none = oclient.chat.completions.create(model=path, messages=oai_body["messages"], tools=oai_body["tools"], temperature=0,
                                           max_tokens=8, tool_choice="none")
    check(not none.choices[0].message.tool_calls and none.choices[0].finish_reason != "tool_calls", "tool_choice none makes no call")

    # 4. The Agents SDK's tool loop: a call of the local function tool, then the answer.
    calls.clear()
    out = asyncio.run(run_agent(path))
    check(calls == ["Paris"], f"the Agents SDK called get_weather('Paris'): {calls}")
    check(out == ANSWER, f"the agent answered after the tool's result: {out!r}")
    o2 = [b for b in recorded if any(m.get("role") == "tool" for m in b["messages"])]
    check(len(o2) == 1 and prompt_text(*openai_conversation(o2[0])) == second_turn, "the agent's second turn is the prompt trained on")
    recorded.clear()

    # 5. The Anthropic client: tool_use blocks streamed and not, and its tool runner's loop.
    m = aclient_a.messages.create(model=path, max_tokens=64, extra_body=GREEDY, messages=ant_body["messages"], tools=ant_body["tools"])
    uses = [b for b in m.content if b.type == "tool_use"]
    check(m.stop_reason == "tool_use" and len(uses) == 1 and uses[0].name == "get_weather" and uses[0].input == {"city": "Paris"},
          f"a tool_use block: {m.content}")
    with aclient_a.messages.stream(model=path, max_tokens=64, extra_body=GREEDY, messages=ant_body["messages"], tools=ant_body["tools"]) as s:
        final = s.get_final_message()
    su = [b for b in final.content if b.type == "tool_use"]
    check(final.stop_reason == "tool_use" and len(su) == 1 and su[0].input == {"city": "Paris"}, f"the streamed tool_use: {final.content}")
    forced = aclient_a.messages.create(model=path, max_tokens=64, extra_body=GREEDY, messages=ant_body["messages"], tools=ant_body["tools"],
                                       tool_choice={"type": "tool", "name": "get_weather"})
    check([b.input for b in forced.content if b.type == "tool_use"] == [{"city": "Paris"}], f"tool_choice tool forces the call: {forced.content}")
    calls.clear()
    out = run_anthropic(aclient_a, path)
    check(calls == ["Paris"] and out == ANSWER, f"the Anthropic tool runner: calls {calls}, answer {out!r}")
    print("agent stacks: all checks passed")


if __name__ == "__main__":
    main()
