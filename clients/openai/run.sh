#!/usr/bin/env bash
# clients/openai/run.sh: the OpenAI-compatible API (/oai/api/v1) driven by the official
# `openai` Python client, and a checkpoint that a tinker training script saved served through
# it at once. Creates/reuses the cached venv of the inference clients (clients/llm-venv.sh), starts
# a `loops serve` (clients/with-server.sh; set LOOPS_URL to use a running one) and runs
# chat.py, embeddings.py (POST embeddings), then agents_tools.py (the OpenAI Agents SDK's and the Anthropic client's tool loops
# on a tiny checkpoint trained to call a tool); then, with the venv's transformers and jinja2, the Go tests that the chat prompt of
# loops/tiny (with tools too) is token for token transformers' apply_chat_template and that gonja renders
# Hugging Face style templates as jinja2 does. Exits non-zero on failure.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
venv=$("$root/clients/llm-venv.sh")
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TINKER_TELEMETRY=0
"$root/clients/with-server.sh" "$venv/bin/python" "$here/chat.py"
"$root/clients/with-server.sh" "$venv/bin/python" "$here/embeddings.py"
"$root/clients/with-server.sh" "$venv/bin/python" "$here/agents_tools.py"
(cd "$root" && LOOPS_PYTHON=$venv/bin/python go test -count=1 -run '^(TestTransformersChatTemplateAgrees|TestTransformersToolsAgree|TestJinja2Agrees)$' -v ./compat/internal/infer | grep -E '^(--- |ok|FAIL)')
