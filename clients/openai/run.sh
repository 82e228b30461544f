#!/usr/bin/env bash
# clients/openai/run.sh: the OpenAI-compatible API (/oai/api/v1) driven by the official
# `openai` Python client, and a checkpoint that a tinker training script saved served through
# it at once. Creates/reuses the cached venv of the inference clients (clients/llm-venv.sh), starts
# a `loops serve` (clients/with-server.sh; set LOOPS_URL to use a running one) and runs
# chat.py and embeddings.py (POST embeddings, checked against the official client's
# decoding of float and base64); then, on one server, agents_tools.py (the OpenAI Agents SDK's and the Anthropic
# client's tool loops on a tiny checkpoint trained to call a tool) and structured.py
# (response_format json_schema strict and json_object on a deployed tiny checkpoint, streamed
# and not, every completed answer validated with jsonschema) and echo.py (/completions echo
# with logprobs: the prompt's log-probs are tinker's compute_logprobs, its alternatives those
# of the decoding path), first on the reference engine,
# then again on the torch worker (`loops serve --backend torch`, a local CPU worker from the
# torch-worker venv, scripts/pyenv.sh); then vision.py on a tiny Qwen3-VL (vl_model.py) served by
# the torch worker: an image sent as an OpenAI image_url part and as an Anthropic image block is
# answered as the same prompt sent as Tinker image chunks, and an image sent to a deployed VL
# checkpoint (one step trained, `loops deploy create`) is its tinker sample; then, with the venv's transformers and jinja2, the Go
# tests that the chat prompt of loops/tiny (with tools too) is token for token transformers'
# apply_chat_template and that gonja renders Hugging Face style templates as jinja2 does.
# Exits non-zero on failure.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
venv=$("$root/clients/llm-venv.sh")
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TINKER_TELEMETRY=0
"$root/clients/with-server.sh" bash -c '"$1" "$2/chat.py" && "$1" "$2/embeddings.py"' chat "$venv/bin/python" "$here"
# The tool loops, structured outputs and echo, on each engine (one server for the scripts).
both=(bash -c '"$1" "$2/agents_tools.py" && "$1" "$2/structured.py" && "$1" "$2/echo.py"' both "$venv/bin/python" "$here")
t0=$SECONDS
"$root/clients/with-server.sh" "${both[@]}"
echo "openai/run.sh: tool loops, structured outputs and echo on the reference engine in $((SECONDS - t0))s" >&2
torch=$("$root/scripts/pyenv.sh" torch-worker $(cat "$root/backends/torch/requirements-cpu.txt"))
t0=$SECONDS
TOKENIZERS_PARALLELISM=false LOOPS_WORKER_PYTHON=$torch/bin/python LOOPS_WORKER_PYTHONPATH=$root/backends/torch:$root/gen/python \
  LOOPS_SERVE_ARGS="--backend torch --backend-opt device=cpu" "$root/clients/with-server.sh" "${both[@]}"
echo "openai/run.sh: tool loops, structured outputs and echo on the torch worker in $((SECONDS - t0))s" >&2
# Images: a tiny Qwen3-VL (written from a seed) on the torch worker, through both clients. It
# needs its own server (--model), so it is skipped against a running one (LOOPS_URL).
if [[ -z ${LOOPS_URL:-} ]]; then
  vl=$(mktemp -d "${TMPDIR:-/tmp}/loops-vl.XXXXXX")
  trap 'rm -rf "$vl"' EXIT
  t0=$SECONDS
  "$torch/bin/python" "$here/vl_model.py" "$vl/qwen3_vl"
  (cd "$root" && go build -o "$vl/loops" ./cmd/loops) # vision.py runs `loops deploy create` too
  LOOPS_BIN=$vl/loops TOKENIZERS_PARALLELISM=false LOOPS_WORKER_PYTHON=$torch/bin/python LOOPS_WORKER_PYTHONPATH=$root/backends/torch:$root/gen/python \
    LOOPS_SERVE_ARGS="--backend torch --backend-opt device=cpu --model $vl/qwen3_vl" \
    "$root/clients/with-server.sh" "$venv/bin/python" "$here/vision.py" "$vl/qwen3_vl"
  echo "openai/run.sh: images through the openai and anthropic clients on the torch worker in $((SECONDS - t0))s" >&2
else
  echo "openai/run.sh: images skipped (vision.py needs its own server with a Qwen3-VL folder; LOOPS_URL is set)" >&2
fi
(cd "$root" && LOOPS_PYTHON=$venv/bin/python go test -count=1 -run '^(TestTransformersChatTemplateAgrees|TestTransformersToolsAgree|TestJinja2Agrees)$' -v ./compat/internal/infer | grep -E '^(--- |ok|FAIL)')
