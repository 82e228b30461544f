#!/usr/bin/env bash
# clients/with-server.sh COMMAND [ARGS...]
#
# Builds the loops binary, starts `loops serve --addr 127.0.0.1:0` on a fresh data dir, waits
# for "Loops listening on URL", runs COMMAND with LOOPS_URL=URL and LOOPS_API_KEY set, stops
# the server, and exits with COMMAND's status. The server log is printed if COMMAND fails.
#
# Environment:
#   LOOPS_URL      use this running server instead of starting one (nothing is built)
#   LOOPS_BIN      use this loops binary instead of building one
#   LOOPS_API_KEY  key sent as X-API-Key (default tml-clients-test; any tml-… key in open mode)
#   LOOPS_SERVE_ARGS  extra `loops serve` arguments, split at spaces (e.g. "--backend torch
#                  --backend-opt device=cpu", with LOOPS_WORKER_PYTHON and LOOPS_WORKER_PYTHONPATH
#                  naming the worker's venv, for the torch worker; default: none, the reference
#                  engine)
#
# If the working tree does not compile (someone is mid-edit), the binary is built from a
# throw-away `git worktree` of HEAD instead; the working tree is never touched.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
export LOOPS_API_KEY=${LOOPS_API_KEY:-tml-clients-test}

if [[ -n ${LOOPS_URL:-} ]]; then
  exec "$@"
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/loops-clients.XXXXXX")
server_pid=
cleanup() {
  if [[ -n $server_pid ]] && kill -0 "$server_pid" 2>/dev/null; then
    kill "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT

bin=${LOOPS_BIN:-}
if [[ -z $bin ]]; then
  bin=$tmp/loops
  t0=$SECONDS
  if ! (cd "$root" && go build -o "$bin" ./cmd/loops) 2>"$tmp/build.log"; then
    echo "with-server: the working tree does not build; building HEAD from a git worktree" >&2
    sed 's/^/  /' "$tmp/build.log" | head -20 >&2
    wt=$tmp/wt
    git -C "$root" worktree add --detach --quiet "$wt" HEAD
    status=0
    (cd "$wt" && go build -o "$bin" ./cmd/loops) || status=$?
    git -C "$root" worktree remove --force "$wt" || true
    [[ $status == 0 ]] || { echo "with-server: go build of HEAD failed too" >&2; exit 1; }
  fi
  echo "with-server: built loops in $((SECONDS - t0))s" >&2
fi

log=$tmp/serve.log
read -ra serve_args <<<"${LOOPS_SERVE_ARGS:-}"
"$bin" serve --addr 127.0.0.1:0 --data-dir "$tmp/data" "${serve_args[@]}" >"$log" 2>&1 &
server_pid=$!
url=
for _ in $(seq 1 3000); do
  url=$(sed -n 's/^Loops listening on \(http:\/\/[^ ]*\).*/\1/p' "$log" | head -1)
  [[ -n $url ]] && break
  kill -0 "$server_pid" 2>/dev/null || break
  sleep 0.1
done
if [[ -z $url ]]; then
  echo "with-server: loops serve did not start; log:" >&2
  cat "$log" >&2
  exit 1
fi
echo "with-server: loops serve at $url" >&2

status=0
LOOPS_URL=$url "$@" || status=$?
if [[ $status != 0 ]]; then
  echo "with-server: command failed ($status); server log (tail):" >&2
  tail -40 "$log" >&2
fi
exit "$status"
