#!/usr/bin/env bash
# tests/ray/run.sh (make test-ray): the Ray pool test against a real local Ray cluster.
#
# Builds/reuses the venv (scripts/pyenv.sh ray-pool: the torch worker's CPU requirements,
# ray[default] for the dashboard and its Jobs API, the tinker SDK), starts a cluster of five
# raylets on this machine (a head with no GPUs, where the pool driver job runs, and four nodes
# declaring 1 logical GPU each: Ray GPUs are only labels here, the workers run on the CPU; a
# 2-GPU replica must span two nodes), runs the Go tests tests/ray (LOOPS_TEST_RAY=1: the
# sharded replica's, which kills one node, then the pool's, which needs three more), and
# stops the cluster.
# Ports: RAY_PORT (6390), RAY_DASHBOARD_PORT (8290). Cold cost: the venv (~1.5 GB of wheels;
# minutes, cached afterwards), then about a minute of cluster start-up.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
venv=$("$root/scripts/pyenv.sh" ray-pool $(cat "$root/backends/torch/requirements-cpu.txt") 'ray[default]==2.60.0' tinker==0.38.0)
port=${RAY_PORT:-6390}
dport=${RAY_DASHBOARD_PORT:-8290}
tmp=$(mktemp -d /tmp/loops-ray.XXXXXX)
export RAY_USAGE_STATS_ENABLED=0 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# Each `ray start` runs in a session of its own (setsid), and every process of this cluster
# (GCS, raylets, dashboard, workers) stays in the session of the start that made it; job
# drivers, in sessions of their own, are killed by Ray's watcher when their supervisor dies.
# Stopping kills those sessions only: `ray stop` would stop every Ray cluster of this user on
# the machine (another test run's, a developer's).
sessions=()
stop() {
  local s i alive
  for s in "${sessions[@]}"; do pkill -TERM -s "$s" 2>/dev/null || true; done
  for i in $(seq 40); do
    alive=0
    for s in "${sessions[@]}"; do pgrep -s "$s" >/dev/null 2>&1 && alive=1; done
    [ "$alive" = 0 ] && break
    sleep 0.25
  done
  for s in "${sessions[@]}"; do pkill -KILL -s "$s" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap stop EXIT
# `ray start` gives a node 30 s to come up (hard-coded); on a loaded machine that can fail,
# so each start is tried three times.
try3() {
  local log=$1 attempt pid
  shift
  for attempt in 1 2 3; do
    setsid "$@" >"$log" 2>&1 &
    pid=$!
    sessions+=("$pid")
    wait "$pid" && return 0
    echo "test-ray: '$*' failed (attempt $attempt): $(tail -1 "$log")" >&2
    sleep 5
  done
  cat "$log" >&2
  return 1
}
start=$(date +%s)
try3 "$tmp/head.log" "$venv/bin/ray" start --head --node-ip-address=127.0.0.1 --port="$port" --dashboard-host=127.0.0.1 \
  --dashboard-port="$dport" --num-cpus=2 --num-gpus=0 --temp-dir="$tmp" --disable-usage-stats
for n in a b c d; do
  try3 "$tmp/node-$n.log" "$venv/bin/ray" start --address="127.0.0.1:$port" --node-ip-address=127.0.0.1 --num-cpus=2 \
    --num-gpus=1 --resources="{\"loops_node_$n\": 1}" --disable-usage-stats
done
echo "test-ray: cluster of 5 raylets up in $(( $(date +%s) - start ))s (dashboard http://127.0.0.1:$dport; load: $(cut -d' ' -f1-3 /proc/loadavg))"
cd "$root"
LOOPS_TEST_RAY=1 LOOPS_RAY_ADDRESS="http://127.0.0.1:$dport" LOOPS_RAY_PYTHON="$venv/bin/python" \
  ${GO:-go} test -count=1 -v -timeout 30m -run 'TestRayShardedReplica|TestRayPool' ./tests/ray/ 2>&1 | tee "$tmp/test.log" | grep -E 'FIGURE|EVENT|SCRIPT|killed|^(---|ok|FAIL|PASS)|Error' || true

grep -q '^ok' "$tmp/test.log" || { tail -80 "$tmp/test.log"; exit 1; }
echo "test-ray: load after: $(cut -d' ' -f1-3 /proc/loadavg)"

