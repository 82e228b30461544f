#!/usr/bin/env bash
# clients/lmeval/run.sh: lm-evaluation-harness (lm_eval from PyPI) on a deployed checkpoint of
# loops/tiny through the OpenAI-compatible API (lmeval_check.py): --model local-completions
# on a multiple-choice task (loglikelihood: /completions with echo and logprobs) and a
# generate_until task, and --model local-chat-completions, each checked against
# transformers on the merged export (reference.py). Three cached venvs (scripts/pyenv.sh):
# lm-eval's (clients/lmeval/venv.sh, torch linked from the torch worker's venv), the
# inference clients' (tinker SDK: the training and the save) and the torch worker's
# (transformers). Starts a `loops serve` (clients/with-server.sh; set LOOPS_URL to use a
# running one). Exits non-zero on failure.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
clients=$("$root/clients/llm-venv.sh")
lmeval=$("$here/venv.sh")
torch=$("$root/scripts/pyenv.sh" torch-worker $(cat "$root/backends/torch/requirements-cpu.txt"))
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TINKER_TELEMETRY=0
t0=$SECONDS
LMEVAL_PYTHON=$lmeval/bin/python TORCH_PYTHON=$torch/bin/python \
  "$root/clients/with-server.sh" "$clients/bin/python" "$here/lmeval_check.py"
echo "lmeval/run.sh: lm-eval on the reference engine in $((SECONDS - t0))s" >&2
