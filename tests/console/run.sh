#!/usr/bin/env bash
# tests/console/run.sh [GO_TEST_ARGS...]
# The console's real-browser test: reuses the tinker-0.38.0 SDK venv of the SDK matrix
# (scripts/pyenv.sh, same requirements, so one cached venv serves both) and runs the Go
# test with chromedp against Debian's chromium (.ci/run installs it). Screenshots go to
# $LOOPS_CONSOLE_SHOTS, or a fresh temporary folder the test prints.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
venv=$("$root/scripts/pyenv.sh" sdk-tinker-0.38.0 tinker==0.38.0 pytest pytest-timeout numpy transformers)
cd "$root/tests/console"
export HF_HUB_OFFLINE=1
LOOPS_CONSOLE_PYTHON="$venv/bin/python" exec go test -tags console -count=1 -v -timeout 15m "$@" .
