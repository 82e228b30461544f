"""Local Python tools for the tool_calling recipe, and the tool-call format.

A call is `<tool_call>{"name": NAME, "arguments": {...}}</tool_call>` in an assistant turn;
its result comes back as a `tool` message holding JSON ({"result": ...} or {"error": ...}).
The final answer is a line `Answer: ...`. The tools are plain functions run in-process: they
evaluate arithmetic with an AST walker (no eval) and look facts up in a table, so the policy's
arguments can never run code.
"""

from __future__ import annotations

import ast
import json
import operator
import re
from typing import Any, Callable

SYSTEM_PROMPT = (
    "You can call tools. To call one, reply with <tool_call>{\"name\": TOOL, \"arguments\": {...}}</tool_call>. "
    "Tools: calculator(expression) evaluates arithmetic; lookup(key) returns a stored fact; "
    "convert(value, unit) converts km<->mi, kg<->lb, c<->f. When you know the answer, reply with Answer: VALUE."
)

FACTS = {
    "capital of france": "Paris", "capital of japan": "Tokyo", "capital of kenya": "Nairobi",
    "capital of peru": "Lima", "boiling point of water in c": "100", "legs of a spider": "8",
    "days in a week": "7", "speed of light in km/s": "299792", "largest planet": "Jupiter",
}

_OPS: dict[type, Callable[..., Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow, ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


def calculator(expression: str) -> str:
    """Arithmetic on numbers with + - * / // % ** and parentheses."""
    if len(expression) > 200:
        raise ValueError("expression longer than 200 characters")

    def ev(node: ast.AST) -> float:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            left, right = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > 64:
                raise ValueError("exponent too large")
            return _OPS[type(node.op)](left, right)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.operand))
        raise ValueError(f"unsupported expression element {type(node).__name__}")

    value = ev(ast.parse(expression, mode="eval"))
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value)


def lookup(key: str) -> str:
    """A fact from the table (case-insensitive key)."""
    k = key.strip().lower()
    if k not in FACTS:
        raise KeyError(f"no fact {key!r}; known: {', '.join(sorted(FACTS))}")
    return FACTS[k]


_CONVERSIONS = {"km": ("mi", 0.621371), "mi": ("km", 1.609344), "kg": ("lb", 2.204623), "lb": ("kg", 0.453592)}


def convert(value: float, unit: str) -> str:
    """value in unit (km, mi, kg, lb, c, f) converted to the other unit of its pair, 2 decimals."""
    u = unit.strip().lower()
    v = float(value)
    if u == "c":
        return f"{v * 9 / 5 + 32:.2f} f"
    if u == "f":
        return f"{(v - 32) * 5 / 9:.2f} c"
    if u not in _CONVERSIONS:
        raise ValueError(f"unknown unit {unit!r}; want km, mi, kg, lb, c or f")
    to, k = _CONVERSIONS[u]
    return f"{v * k:.2f} {to}"


TOOLS: dict[str, Callable[..., str]] = {"calculator": calculator, "lookup": lookup, "convert": convert}

_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)
_ANSWER = re.compile(r"Answer:\s*(.+)")

# The tools as OpenAI function tools (the `tools` of a chat completion request), for the
# recipe's evaluation through a deployed checkpoint's OpenAI-compatible route.
OPENAI_TOOLS = [
    {"type": "function", "function": {"name": "calculator", "description": "Evaluates arithmetic.",
                                      "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                                                     "required": ["expression"]}}},
    {"type": "function", "function": {"name": "lookup", "description": "Returns a stored fact.",
                                      "parameters": {"type": "object", "properties": {"key": {"type": "string"}},
                                                     "required": ["key"]}}},
    {"type": "function", "function": {"name": "convert", "description": "Converts km<->mi, kg<->lb, c<->f.",
                                      "parameters": {"type": "object", "properties": {"value": {"type": "number"}, "unit": {"type": "string"}},
                                                     "required": ["value", "unit"]}}},
]


def parse_call(text: str) -> tuple[str, dict] | str | None:
    """(name, arguments) of the first tool call in text; a string saying why it is invalid; or
    None when the text has no call."""
    m = _CALL.search(text)
    if not m:
        return None
    try:
        call = json.loads(m.group(1))
    except json.JSONDecodeError as e:
        return f"the call is not JSON: {e.msg}"
    if not isinstance(call, dict) or call.get("name") not in TOOLS or not isinstance(call.get("arguments"), dict):
        return f"want {{\"name\": one of {sorted(TOOLS)}, \"arguments\": {{...}}}}"
    return call["name"], call["arguments"]


def execute(name: str, arguments: dict) -> tuple[bool, str]:
    """Runs a tool; returns (ok, JSON result or error)."""
    try:
        return True, json.dumps({"result": TOOLS[name](**arguments)})
    except Exception as e:  # noqa: BLE001 - the policy sees the error
        return False, json.dumps({"error": f"{type(e).__name__}: {e}"[:300]})


def parse_answer(text: str) -> str | None:
    m = _ANSWER.search(text)
    return m.group(1).strip() if m else None


def answers_match(got: str, want: str) -> bool:
    norm = lambda s: re.sub(r"[\s.]+$", "", s.strip().lower())  # noqa: E731
    return norm(got) == norm(want)
