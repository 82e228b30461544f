"""JSONL loading with per-line validation (errors name the file and line)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

# A validator returns None for a good record, or what is wrong with it.
Validator = Callable[[Any], "str | None"]


class DataError(ValueError):
    """A data file that does not parse; the message lists the first problems."""


def read_jsonl(path: str | Path, validate: Validator) -> tuple[list[Any], list[str]]:
    """Reads one JSON object per non-empty line; returns the good records and the errors."""
    items: list[Any] = []
    errors: list[str] = []
    p = Path(path)
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except OSError as e:
        return [], [f"{p}: {e.strerror or e}"]
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            errors.append(f"{p}:{n}: not JSON ({e.msg})")
            continue
        why = validate(rec)
        if why:
            errors.append(f"{p}:{n}: {why}")
        else:
            items.append(rec)
    if not items and not errors:
        errors.append(f"{p}: no records")
    return items, errors


def load_jsonl(path: str | Path, validate: Validator) -> list[Any]:
    """read_jsonl that raises DataError on any bad line."""
    items, errors = read_jsonl(path, validate)
    if errors:
        more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
        raise DataError("; ".join(errors[:5]) + more)
    return items


def messages_error(msgs: Any) -> str | None:
    """Why a value is not a list of {role, content} messages, or None."""
    if not isinstance(msgs, list) or not msgs:
        return "messages must be a non-empty list"
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            return f"messages[{i}] must be an object with string role and content"
        if m["role"] not in ("system", "user", "assistant", "tool"):
            return f"messages[{i}].role {m['role']!r}: want system, user, assistant or tool"
    return None
