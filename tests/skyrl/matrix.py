"""Renders `loops conformance --json` reports of several servers as one markdown matrix.

usage: python matrix.py OUT.md NAME=REPORT.json [NAME=REPORT.json ...] [--note TEXT]
       python matrix.py --counts REPORT.json      # "N passed, M failed, K skipped"
       python matrix.py --failures REPORT.json    # each failed check and its reason, one line

Rows are the checks (SDK-level checks, then protocol cases on the Tinker surface), columns
the servers; a cell is pass / FAIL / skip / known, and every failure's reason is listed
under the table, numbered, so the table stays readable."""

from __future__ import annotations

import json
import sys


def counts(rep: dict) -> str:
    return f"{rep['passed']} passed, {rep['failed']} failed, {rep['skipped']} skipped"


def failures(rep: dict) -> str:
    failed = [r for r in rep["results"] if r["status"] == "fail"]
    return "; ".join(f"`{r['name']}`: " + " ".join(r.get("reason", "").split())[:200] for r in failed) or "none"


def main(argv: list[str]) -> int:
    if argv[0] in ("--counts", "--failures"):
        with open(argv[1]) as f:
            rep = json.load(f)
        print(counts(rep) if argv[0] == "--counts" else failures(rep))
        return 0
    out, rest = argv[0], argv[1:]
    notes_text = []
    servers: list[tuple[str, dict]] = []
    it = iter(rest)
    for a in it:
        if a == "--note":
            notes_text.append(next(it))
            continue
        name, _, path = a.partition("=")
        with open(path) as f:
            servers.append((name, json.load(f)))
    rows: list[str] = []
    cells: dict[tuple[str, str], dict] = {}
    for name, rep in servers:
        for r in rep["results"]:
            if r["name"] not in rows:
                rows.append(r["name"])
            cells[(r["name"], name)] = r
    lines = ["| check | " + " | ".join(n for n, _ in servers) + " |",
             "|---|" + "---|" * len(servers)]
    reasons: list[str] = []
    for row in rows:
        out_cells = []
        for name, _ in servers:
            r = cells.get((row, name))
            if r is None:
                out_cells.append("—")
                continue
            status = r["status"]
            label = {"pass": "pass", "fail": "**FAIL**", "skip": "skip", "known_failing": "known"}.get(status, status)
            if status != "pass" and r.get("reason"):
                reason = " ".join(r["reason"].split())
                if len(reason) > 400:
                    reason = reason[:400] + "…"
                reasons.append(f"{len(reasons) + 1}. {name}, `{row}`: {reason}")
                label += f" [{len(reasons)}]"
            out_cells.append(label)
        lines.append(f"| `{row}` | " + " | ".join(out_cells) + " |")
    summary = ["| server | passed | failed | known failing | skipped |", "|---|---|---|---|---|"]
    for name, rep in servers:
        summary.append(f"| {name} | {rep['passed']} | {rep['failed']} | {rep['known_failing']} | {rep['skipped']} |")
    text = "\n".join(notes_text + [""] + summary + [""] + lines + ["", "Reasons:", ""] + reasons) + "\n"
    with open(out, "w") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
