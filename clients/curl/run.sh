#!/usr/bin/env bash
# clients/curl/run.sh: clients/curl/check.sh (the OpenAI and Anthropic routes with curl,
# streaming included) against a fresh `loops serve` (clients/with-server.sh; set LOOPS_URL to
# use a running one).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
exec "$here/../with-server.sh" bash "$here/check.sh"
