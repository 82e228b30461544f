#!/usr/bin/env bash
# clients/anthropic/run.sh: the Anthropic-compatible API (/anthropic/api/v1/messages) driven
# by the official `anthropic` Python client, and a checkpoint that a running tinker training
# script saved served through it at once (messages.py). Uses the venv shared with
# clients/openai (clients/llm-venv.sh) and starts a `loops serve` (clients/with-server.sh;
# set LOOPS_URL to use a running one). Exits non-zero on failure.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
venv=$("$root/clients/llm-venv.sh")
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TINKER_TELEMETRY=0
"$root/clients/with-server.sh" "$venv/bin/python" "$here/messages.py"
