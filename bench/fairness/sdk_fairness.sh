#!/usr/bin/env bash
# bench/fairness/sdk_fairness.sh [BASE_REF]: a light tenant's forward_backward latency beside a
# flooding tenant, through the real tinker SDK (sdk_fairness.py), on this tree's `loops
# serve` and on BASE_REF's (default: the environment's LOOPS_BENCH_BASE, else HEAD~1), in
# alternating rounds on one machine, so the two are compared side by side. Each round starts
# a fresh server (reference engine, loops/tiny) with two keys in two workspaces.
#
#   ROUNDS=2 SCENARIOS=alone,a,b,c ITERATIONS=100 MAX_SECONDS=120 bash bench/fairness/sdk_fairness.sh <ref>
#
# Prints sdk_fairness.py's JSON lines, labelled "base" and "new".
#
# With CONFIGS (serve arguments for this tree, ';' between configurations), each round runs
# this tree once per configuration instead, labelled by its arguments, and no base: how the
# scheduler's settings compare, e.g.
#
#   CONFIGS='--train-chunk-tokens 512;--train-chunk-tokens 1024;--train-concurrency 1' \
#     SCENARIOS=alone,a bash bench/fairness/sdk_fairness.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
base=${1:-${LOOPS_BENCH_BASE:-HEAD~1}}
rounds=${ROUNDS:-2}
scenarios=${SCENARIOS:-alone,a,b,c}
iterations=${ITERATIONS:-100}
max_seconds=${MAX_SECONDS:-120}
work=$(mktemp -d "${TMPDIR:-/tmp}/loops-sdk-fairness.XXXXXX")
trap 'kill $(jobs -p) 2>/dev/null || true; git -C "$root" worktree remove --force "$work/base-src" 2>/dev/null || true; rm -rf "$work"' EXIT

venv=$("$root/scripts/pyenv.sh" tinker-0.38.0 tinker==0.38.0 pytest pytest-timeout numpy transformers)
configs=${CONFIGS:-}
(cd "$root" && go build -o "$work/loops-new" ./cmd/loops)
if [ -z "$configs" ]; then
  git -C "$root" worktree add -q --detach "$work/base-src" "$base"
  (cd "$work/base-src" && go build -o "$work/loops-base" ./cmd/loops)
fi

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'; }

run() { # label binary [serve arguments...]
  local label=$1 bin=$2 p dir pid
  shift 2
  p=$(port)
  dir=$(mktemp -d "$work/data.XXXXXX")
  "$bin" serve --addr "127.0.0.1:$p" --data-dir "$dir" \
    --api-key tml-light-bench=light --api-key tml-heavy-bench=heavy --api-key tml-heavy2-bench=heavy2 "$@" >"$dir/serve.log" 2>&1 &
  pid=$!
  for _ in $(seq 300); do curl -fs "http://127.0.0.1:$p/healthz" >/dev/null 2>&1 && break; sleep 0.1; done
  TINKER_BASE_URL="http://127.0.0.1:$p" "$venv/bin/python" "$root/bench/fairness/sdk_fairness.py" \
    --light-key tml-light-bench --heavy-key tml-heavy-bench --heavy2-key tml-heavy2-bench --scenarios "$scenarios" \
    --iterations "$iterations" --max-seconds "$max_seconds" --label "$label"
  kill "$pid"
  wait "$pid" 2>/dev/null || true
}

for r in $(seq "$rounds"); do
  if [ -n "$configs" ]; then
    IFS=';' read -r -a list <<<"$configs"
    for c in "${list[@]}"; do
      read -r -a args <<<"$c"
      run "${c:-defaults}" "$work/loops-new" "${args[@]}"
    done
    continue
  fi
  run base "$work/loops-base"
  run new "$work/loops-new"
done
