#!/usr/bin/env bash
# clients/lmeval/venv.sh: prints the path of the cached venv (scripts/pyenv.sh) with
# lm-evaluation-harness (lm-eval[api], the local-completions and local-chat-completions
# models). lm-eval requires torch: the torch worker's CPU torch is linked in
# (tests/sdk_matrix/torch_overlay.sh) before pip installs, so pip does not download a second
# torch; the torch-worker venv is built first when it is missing.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
torch=$("$root/scripts/pyenv.sh" torch-worker $(cat "$root/backends/torch/requirements-cpu.txt"))
export LOOPS_TORCH_VENV=$torch
# torch imports typing_extensions, which the overlay does not carry: installed first.
export LOOPS_PYENV_BEFORE_INSTALL="f() { \"\$1/bin/pip\" install -q typing_extensions >&2 && bash '$root/tests/sdk_matrix/torch_overlay.sh' \"\$1\" >&2; }; f"
exec "$root/scripts/pyenv.sh" lm-eval-0.4.13 'lm-eval[api]==0.4.13' transformers==5.24.0
