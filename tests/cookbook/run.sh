#!/usr/bin/env bash
# tests/cookbook/run.sh [PYTEST_ARGS...]
# tinker-cookbook 0.6.1 recipes (chat_sl, math_rl env=arithmetic) run unmodified against a
# fresh `loops serve`; see tests/cookbook/README.md. The venv comes from tests/cookbook/venv.sh.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
venv=$("$here/venv.sh")
cd "$root"
exec "$venv/bin/python" -m pytest -c tests/cookbook/pytest.ini --rootdir tests/cookbook tests/cookbook "$@"
