#!/usr/bin/env bash
# tests/e2e/run.sh [PYTEST_ARGS...]
# Creates/reuses the tinker-0.38.0 venv (scripts/pyenv.sh) and runs the e2e suite.
# Set LOOPS_E2E_TORCH=1 to use a venv that also has torch (for forward_backward_custom;
# large download from PyPI). See tests/e2e/README.md for the LOOPS_E2E_* knobs.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
reqs=(tinker==0.38.0 pytest pytest-timeout numpy transformers)
name=tinker-0.38.0
if [[ ${LOOPS_E2E_TORCH:-0} == 1 ]]; then
  reqs+=(torch)
  name=tinker-0.38.0-torch
fi
venv=$("$root/scripts/pyenv.sh" "$name" "${reqs[@]}")
cd "$root"
exec "$venv/bin/python" -m pytest tests/e2e "$@"
