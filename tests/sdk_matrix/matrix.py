"""Turn the per-version JSON results of tests/sdk_matrix into a markdown table.

usage: python3 tests/sdk_matrix/matrix.py RESULTS_DIR > MATRIX.md
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

CELLS = [
    ("sft", "SFT loop, loss falls (8 steps)"),
    ("forward", "forward: logprobs, no side effects, == forward_backward"),
    ("forward_backward_custom", "forward_backward_custom == cross_entropy (torch)"),
    ("compute_logprobs", "compute_logprobs == trainer forward"),
    ("sync_api", "sync API round trip"),
    ("async_api", "async API round trip (*_async, result_async)"),
    ("multi_client", "several training clients on one base model, interleaved"),
    ("save_load_optimizer", "save_state → load_state_with_optimizer / create_from_state resume identically"),
    ("save_weights_and_get_sampling_client", "save_weights_and_get_sampling_client (frozen snapshot)"),
    ("sampling_params", "sampling: num_samples, max_tokens, temperature, top_k, top_p, seed, stop ids/strings, prompt + top-k logprobs"),
    ("rest_listings", "RestClient listings (runs, checkpoints, user checkpoints, weights_info)"),
    ("rest_delete", "RestClient delete_checkpoint[_from_tinker_path]"),
    ("rest_ttl", "TTL: save_state(ttl_seconds), set_checkpoint_ttl"),
    ("rest_publish", "publish / unpublish"),
    ("archive_download", "checkpoint archive URL download (tar with PEFT adapter)"),
    ("cli_run", "`tinker run list/info`"),
    ("cli_checkpoint", "`tinker checkpoint list/info/publish/unpublish/set-ttl/delete`"),
    ("cli_download", "`tinker checkpoint download`"),
    ("cli_push_hf", "`tinker checkpoint push-hf` (Hugging Face upload)"),
    ("cli_model", "`tinker model list`"),
    ("cli_billing", "`tinker billing usage/checkpoint-storage`"),
    ("cli_session", "`tinker session export-trace`"),
    ("cli_auth", "`tinker auth status/whoami/login/logout`"),
    ("cli_version", "`tinker version`"),
    ("cli_unclassified", "CLI commands with no recipe in test_cli.py (must be empty)"),
]


def vkey(v: str) -> tuple:
    return tuple(int(x) if x.isdigit() else 0 for x in v.split("."))


def main() -> None:
    runs = [json.loads(p.read_text()) for p in Path(sys.argv[1]).glob("*.json")
            if not p.name.startswith("surface-")]  # surface.py renders those
    if not any(r["records"] for r in runs):
        sys.exit(3)  # no feature cell ran (e.g. only the surface test): keep MATRIX.md as it is
    runs.sort(key=lambda r: vkey(r["version"]))
    notes: list[str] = []
    head = "| feature | " + " | ".join(f"tinker {r['version']}" for r in runs) + " |"
    lines = [
        "# tinker SDK × Loops feature matrix",
        "",
        "Written by `tests/sdk_matrix/run.sh` (see tests/sdk_matrix/README.md). "
        "pass = every test of the row passed; fail = one failed (reason in the notes); "
        "n/a = the release lacks the feature; expected fail = a route Loops does not serve yet "
        "(test_cli.py EXPECTED_TO_FAIL).",
        "",
        head,
        "|" + "---|" * (len(runs) + 1),
    ]
    for key, title in CELLS:
        row = [title]
        for r in runs:
            recs = [x for x in r["records"] if x["cell"] == key]
            if not recs:
                row.append("–")
                continue
            st = {x["status"] for x in recs}
            if "fail" in st:
                n = len(notes) + 1
                why = "; ".join(f"{x['test']}: {x['reason']}" for x in recs if x["status"] == "fail")
                notes.append(f"{n}. tinker {r['version']}, {key}: {why}")
                row.append(f"**fail** [{n}]")
            elif "xfail" in st:
                n = len(notes) + 1
                why = "; ".join(f"{x['test']}: {x['reason']}" for x in recs if x["status"] == "xfail")
                notes.append(f"{n}. tinker {r['version']}, {key} (expected to fail, test_cli.py EXPECTED_TO_FAIL): {why}")
                row.append(f"expected fail [{n}]" if st <= {"xfail", "n/a"} else f"pass, part expected fail [{n}]")
            elif st == {"n/a"}:
                n = len(notes) + 1
                notes.append(f"{n}. tinker {r['version']}, {key}: {recs[0]['reason']}")
                row.append(f"n/a [{n}]")
            elif "n/a" in st:
                n = len(notes) + 1
                why = "; ".join(f"{x['test']}: {x['reason']}" for x in recs if x["status"] == "n/a")
                notes.append(f"{n}. tinker {r['version']}, {key} (partly n/a): {why}")
                row.append(f"pass, part n/a [{n}]")
            else:
                row.append("pass")
        lines.append("| " + " | ".join(row) + " |")
    lines.append("| wall time (s) | " + " | ".join(str(r["wall_s"]) for r in runs) + " |")
    lines.append("| torch on the client | " + " | ".join(str(r.get("torch") or "none") for r in runs) + " |")
    if notes:
        lines += ["", "Notes:", ""] + notes
    print("\n".join(lines))


if __name__ == "__main__":
    main()
