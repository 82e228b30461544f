#!/usr/bin/env bash
# tests/recipes/run.sh [PYTEST_ARGS...]
# The Loops cookbook's recipes (cookbook/) against a fresh `loops serve` on loops/tiny: learning
# shown (SFT eval loss, RL reward sync and async, DPO), the agent recipes end to end with real
# sandboxes, and `loops cookbook check|run`. See tests/recipes/README.md.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
venv=$("$root/scripts/pyenv.sh" loops-cookbook-tests tinker==0.38.0 transformers jinja2 tqdm pytest pytest-timeout)
cd "$root"
export HF_HUB_OFFLINE=1
# The whole folder unless test files are named (tests/recipes/test_x.py[::test]).
where=tests/recipes
for a in "$@"; do [[ $a == tests/recipes/* ]] && where=; done
exec "$venv/bin/python" -m pytest -c tests/recipes/pytest.ini --rootdir tests/recipes $where "$@"
