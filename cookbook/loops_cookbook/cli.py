"""`python -m loops_cookbook list | show NAME | check NAME | run NAME [key=value ...]`.

`loops cookbook` (the Go command) runs this CLI in the cookbook's venv: `list --json` is where
its recipe list comes from, `check --json` gives the local rows of its table.

Exit codes: 0 success; 1 a check failed or an unexpected error; 2 usage or config error
(unknown recipe or field, bad value); 3 data error (a file does not parse); 4 the server
refused or could not be reached (connection, API key, rejected request).
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import sys
import traceback
from typing import Any

from loops_cookbook import hub, registry
from loops_cookbook.config import apply_overrides
from loops_cookbook.data import DataError, read_jsonl

EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_DATA, EXIT_SERVER = 0, 1, 2, 3, 4


def main(argv: list[str] | None = None) -> int:
    # The recipes need only transformers' tokenizers; its "PyTorch was not found" notice is noise.
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    p = argparse.ArgumentParser(prog="loops_cookbook", description="Loops cookbook recipes")
    sub = p.add_subparsers(dest="cmd", required=True)
    ls = sub.add_parser("list", help="list the recipes")
    ls.add_argument("--json", action="store_true")
    sh = sub.add_parser("show", help="a recipe's purpose, data format and config")
    sh.add_argument("name")
    sh.add_argument("--json", action="store_true")
    ck = sub.add_parser("check", help="check a recipe's data, tokenizer, chat template and sandbox (trains nothing)")
    ck.add_argument("name")
    ck.add_argument("overrides", nargs="*", help="config key=value")
    ck.add_argument("--max-seq-len", type=int, default=0, help="the server's limit for the model (0: the recipe's max_length)")
    ck.add_argument("--json", action="store_true")
    ck.add_argument("--estimate", action="store_true",
                    help="with --json: add the run's token counts and settings (an EstimateCost request) as \"estimate\"")
    ck.add_argument("--pilot", type=int, default=0, metavar="K",
                    help="with --estimate: run the recipe's first K RL steps for real (metered) and extrapolate the rest")
    rn = sub.add_parser("run", help="run a recipe")
    rn.add_argument("name")
    rn.add_argument("overrides", nargs="*", help="config key=value")
    rn.add_argument("--resume", metavar="DIR",
                    help="continue the run logged in DIR (a pilot's or an interrupted run's) from its last checkpoint, with its config")
    args = p.parse_args(argv)
    try:
        if args.cmd == "list":
            return cmd_list(args.json)
        if args.cmd == "show":
            return cmd_show(args.name, args.json)
        resume = getattr(args, "resume", None)
        cfg = resumed_config(args.name, resume, args.overrides) if resume else config_for(args.name, args.overrides)
        hub.offline_when_cached(getattr(cfg, "model", ""))
        if args.cmd == "check":
            return cmd_check(args.name, cfg, args.max_seq_len, args.json, args.estimate, args.pilot)
        return cmd_run(args.name, cfg)
    except (KeyError, ValueError) as e:
        if isinstance(e, DataError):
            print(f"data error: {e}", file=sys.stderr)
            return EXIT_DATA
        print(f"error: {e.args[0] if isinstance(e, KeyError) else e}", file=sys.stderr)
        return EXIT_USAGE


def config_for(name: str, overrides: list[str]) -> Any:
    return apply_overrides(registry.load(name).Config(), overrides)


# What a resumed run may set differently from the run it continues: where it connects, how
# it shows progress and how often it saves. Anything else would not continue the same run.
RESUME_MAY_CHANGE = {"base_url", "progress", "save_every", "log_dir", "resume"}


def resumed_config(name: str, log_dir: str, overrides: list[str]) -> Any:
    """The config of the run logged in log_dir (its config.json), with overrides that do not
    change what it computes, and resume=log_dir."""
    import dataclasses
    from pathlib import Path

    path = Path(log_dir) / "config.json"
    if not path.exists():
        raise ValueError(f"--resume {log_dir}: no config.json there (want the log folder of a run or a pilot)")
    from loops_cookbook.runtime import resume_point

    resume_point(name, Path(log_dir))  # a checkpoint to continue from, or why there is none
    saved = json.loads(path.read_text())
    fields = {f.name for f in dataclasses.fields(registry.load(name).Config)}
    if unknown := sorted(set(saved) - fields):
        raise ValueError(f"--resume {log_dir}: its config.json has fields {name} does not ({', '.join(unknown)}): is it a {name} run?")
    base = dataclasses.replace(registry.load(name).Config(), **saved)
    cfg = apply_overrides(base, overrides)
    for f in sorted(fields - RESUME_MAY_CHANGE):
        if getattr(cfg, f) != getattr(base, f):
            raise ValueError(f"--resume {log_dir}: {f}={getattr(cfg, f)!r} differs from the run's {getattr(base, f)!r}; "
                             f"a resumed run keeps its config (only {', '.join(sorted(RESUME_MAY_CHANGE - {'resume'}))} may change)")
    return dataclasses.replace(cfg, resume=log_dir, log_dir=log_dir)


def cmd_list(as_json: bool) -> int:
    if as_json:
        print(json.dumps([{"name": n, "summary": s} for n, s in registry.RECIPES.items()]))
        return EXIT_OK
    width = max(map(len, registry.RECIPES))
    for n, s in registry.RECIPES.items():
        print(f"{n:<{width}}  {s}")
    return EXIT_OK


def cmd_show(name: str, as_json: bool) -> int:
    d = registry.describe(name)
    if as_json:
        print(json.dumps(d, default=str))
        return EXIT_OK
    print(f"{d['name']}: {d['summary']}\n\n{d['description']}\n\nData format:\n{d['data_format']}\n\nConfig (key=value):")
    width = max(len(f["name"]) for f in d["config"])
    for f in d["config"]:
        print(f"  {f['name']:<{width}}  {f['default']!s:<12} {f['help']}")
    return EXIT_OK


def check_rows(name: str, cfg: Any, max_seq_len: int) -> list[dict]:
    """The local checks: data files parse, tokenizer, chat template, sequence lengths, sandbox."""
    mod = registry.load(name)
    rows: list[dict] = []

    def row(check: str, ok: bool, detail: str) -> None:
        rows.append({"check": check, "ok": ok, "detail": detail})

    data_ok = True
    for role, (path, validate) in mod.data_files(cfg).items():
        items, errors = read_jsonl(path, validate)
        data_ok &= not errors
        more = f" (+{len(errors) - 3} more)" if len(errors) > 3 else ""
        row(f"data {role}", not errors, f"{len(items)} records in {path}" if not errors else "; ".join(errors[:3]) + more)
    chat = None
    try:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(cfg.model)
        row("tokenizer", True, f"{cfg.model}: {type(tok).__name__}, {len(tok)} tokens")
    except Exception as e:  # noqa: BLE001 - reported as a failed row
        tok = None
        row("tokenizer", False, f"{cfg.model}: {str(e).splitlines()[0][:200]} (HF_HUB_OFFLINE=1 needs it in the local HF cache)")
    if tok is not None:
        from loops_cookbook.chat import ChatML, template_matches

        ok, detail = template_matches(tok)
        row("chat template", ok, detail)
        try:
            chat = ChatML(tok)
        except ValueError:
            chat = None
    limit = max_seq_len or cfg.max_length
    if chat is not None and data_ok:
        lengths = mod.token_lengths(cfg, chat)
        over = sum(n > limit for n in lengths)
        truncated = sum(n > cfg.max_length for n in lengths)
        detail = f"{over} of {len(lengths)} examples exceed {limit} tokens (longest {max(lengths, default=0)})"
        if max_seq_len and cfg.max_length < max_seq_len:
            detail += f"; {truncated} exceed max_length={cfg.max_length} and are truncated"
        row("sequence length", over == 0, detail)
    else:
        row("sequence length", False, "not measured: needs parsed data and a ChatML tokenizer")
    if getattr(mod, "USES_SANDBOX", False):
        from loops_cookbook.sandbox import self_test

        ok, detail = self_test()
        row("sandbox", ok, detail)
    return rows


def estimate_request(name: str, cfg: Any, pilot_steps: int = 0, used: dict | None = None) -> dict | None:
    """The recipe's EstimateCost request (token counts through the model's tokenizer, steps,
    batch and group sizes; with pilot_steps > 0, tokens by kind from a pilot of that many RL
    steps, loops_cookbook.pilot), {"error": why} when it cannot give one, or None for a
    recipe with no `estimate` function. A pilot puts the server sessions and training runs
    it used in `used` ("sessions", "runs"): its cost is their usage; and "resume": its log
    folder, which `run NAME --resume` continues from."""
    mod = registry.load(name)
    if not hasattr(mod, "estimate"):
        return None
    from transformers import AutoTokenizer

    from loops_cookbook.chat import ChatML

    chat = ChatML(AutoTokenizer.from_pretrained(cfg.model))
    if pilot_steps <= 0:
        try:
            return mod.estimate(cfg, chat)
        except RuntimeError as e:  # a client package the recipe needs is missing (vision_sft)
            return {"error": str(e)}
    if "pilot" not in inspect.signature(mod.estimate).parameters:
        return {"error": f"{name} is estimated exactly from its data: leave out --pilot"}
    if pilot_steps >= cfg.steps:
        return {"error": f"--pilot {pilot_steps} would run all of its {cfg.steps} RL steps: run it instead, or pilot fewer"}
    from loops_cookbook import pilot

    measured = pilot.run(mod, cfg, pilot_steps)
    if used is not None:
        used.update(sessions=measured["sessions"], runs=measured["runs"], resume=measured["resume"])
    return mod.estimate(cfg, chat, measured)


def cmd_check(name: str, cfg: Any, max_seq_len: int, as_json: bool, estimate: bool = False, pilot_steps: int = 0) -> int:
    rows = check_rows(name, cfg, max_seq_len)
    if as_json:
        out: dict = {"recipe": name, "checks": rows}
        if estimate and all(r["ok"] for r in rows):
            used: dict = {}
            req = estimate_request(name, cfg, pilot_steps, used)
            if used:
                out["pilot_sessions"], out["pilot_runs"] = used["sessions"], used["runs"]
                if used.get("resume"):
                    # the pilot's steps need not run twice: the run continues from them
                    out["resume"] = used["resume"]
            if isinstance(req, dict) and "error" in req:
                out["estimate_error"] = req["error"]
            else:
                out["estimate"] = req
        print(json.dumps(out))
    else:
        width = max(len(r["check"]) for r in rows)
        for r in rows:
            print(f"{'PASS' if r['ok'] else 'FAIL'}  {r['check']:<{width}}  {r['detail']}")
    return EXIT_OK if all(r["ok"] for r in rows) else EXIT_FAIL


def cmd_run(name: str, cfg: Any) -> int:
    import tinker

    from loops_cookbook.runtime import close_open_runs

    mod = registry.load(name)
    try:
        result = mod.main(cfg)
    except DataError as e:
        close_open_runs("errored", f"data error: {e}")
        print(f"data error: {e}", file=sys.stderr)
        return EXIT_DATA
    except tinker.APIConnectionError as e:
        print(f"server unreachable: {e}", file=sys.stderr)
        return EXIT_SERVER
    except tinker.APIStatusError as e:
        close_open_runs("errored", f"the server refused a request ({e.status_code})")
        if e.status_code >= 500:
            print(f"server error ({e.status_code}): {server_message(e)}", file=sys.stderr)
            return EXIT_FAIL
        # A refused request (bad key, a limit, a bad value) is the caller's to fix: the
        # server's own words say how, a Python traceback would bury them.
        print(f"the server refused a request ({e.status_code} {type(e).__name__}): {server_message(e)}",
              file=sys.stderr)
        return EXIT_SERVER
    except KeyboardInterrupt:
        close_open_runs("interrupted")
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - the traceback is the report
        close_open_runs("errored", f"{type(e).__name__}: {e}"[:500])
        traceback.print_exc()
        return EXIT_FAIL
    print(json.dumps({"recipe": name, **result}, default=str))
    return EXIT_OK


def server_message(e: Any) -> str:
    """The server's explanation of a refused request: its JSON `detail` (Loops and Tinker
    answer {"detail": ..., "reason": ...}), else the SDK's message."""
    body = getattr(e, "body", None)
    if isinstance(body, dict) and body.get("detail"):
        reason = body.get("reason")
        return f"{body['detail']}" + (f" [{reason}]" if reason else "")
    return str(e)
