"""Render the surface results of tests/sdk_matrix (surface-<version>.json) as SURFACE.md.

usage: python3 tests/sdk_matrix/surface.py RESULTS_DIR > tests/sdk_matrix/SURFACE.md
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

OUTCOMES = ("served", "refused", "not served", "n/a", "failing", "unclassified")


def vkey(v: str) -> tuple:
    return tuple(int(x) if x.isdigit() else 0 for x in v.split("."))


def cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def main() -> None:
    runs = [json.loads(p.read_text()) for p in Path(sys.argv[1]).glob("surface-*.json")]
    runs.sort(key=lambda r: vkey(r["version"]), reverse=True)
    out = [
        "# tinker SDK surface × Loops",
        "",
        "Written by `tests/sdk_matrix/run.sh` (`make test-sdk-surface`; see tests/sdk_matrix/README.md). "
        "The items are enumerated from the installed `tinker` package by introspection "
        "(`surface_enum.py`): every public method of ServiceClient, TrainingClient, SamplingClient, "
        "RestClient and AdminClient (sync and async forms, deprecated aliases included), every "
        "`LossFnType`, every optimizer type, every `SamplingParams` field and `sample()` argument, "
        "every `ModelInput` chunk type. Each is called against `loops serve` by a recipe in "
        "`surface_recipes.py` that checks the answer.",
        "",
        "- **served**: the call succeeded and its answer passed the recipe's check "
        "(*client-side* items never reach the server);",
        "- **refused**: the server answered an error that says why (4xx or 501), quoted;",
        "- **not served**: Loops' generic 404 \"… is not supported by Loops\" (a hole to close), "
        "or the SDK refusing before any request because of the server's configuration;",
        "- **n/a**: the client cannot make the call (no torch, or a defect of that SDK release); "
        "no request reached the server;",
        "- **failing**: a wrong answer, a 5xx or a crash; **unclassified**: no recipe. "
        "Either fails the suite.",
        "",
        "| tinker | items | " + " | ".join(OUTCOMES) + " |",
        "|---|---|" + "---|" * len(OUTCOMES),
    ]
    for r in runs:
        recs = r["records"]
        counts = [sum(x["outcome"] == o for x in recs) for o in OUTCOMES]
        out.append(f"| {r['version']} | {len(recs)} | " + " | ".join(map(str, counts)) + " |")
    for r in runs:
        recs = r["records"]
        out += ["", f"## tinker {r['version']}", ""]
        bad = [x for x in recs if x["outcome"] != "served"]
        if bad:
            out += ["Not served by Loops, refused, or failing:", ""]
            out += [f"- `{x['id']}` — **{x['outcome']}**: {cell(x['reason'])}" for x in bad]
            out.append("")
        out += ["| item | outcome | detail |", "|---|---|---|"]
        for x in recs:
            tags = [t for t, on in (("async", x["async"]), ("deprecated", x["deprecated"]),
                                    ("client-side", x.get("client_side"))) if on]
            name = f"`{x['id']}`" + (f" ({', '.join(tags)})" if tags else "")
            outcome = x["outcome"] if x["outcome"] == "served" else f"**{x['outcome']}**"
            out.append(f"| {name} | {outcome} | {cell(x['reason'])} |")
    print("\n".join(out))


if __name__ == "__main__":
    main()
