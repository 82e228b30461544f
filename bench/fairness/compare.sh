#!/usr/bin/env bash
# compare.sh BASE [RUNS]: runs benchmarks of this package (TestSamplingFairness, or those
# the regular expression TEST matches) on the tree at git revision BASE ("before") and on
# this working tree ("after"), alternating, RUNS times each (default 3), each run headed by
# the time and the load average. The base tree runs this tree's benchmark files (copied
# into a temporary git worktree of BASE), so both measure the same thing. Environment:
# LOOPS_BENCH_SLOTS, LOOPS_BENCH_PARTS (see sampling_test.go), TEST.
#
#   bench/fairness/compare.sh main 3 2>&1 | tee /tmp/compare.log
set -euo pipefail
root=$(git rev-parse --show-toplevel)
base=${1:?usage: compare.sh BASE [RUNS]}
runs=${2:-3}
tmp=$(mktemp -d)
cleanup() {
  git -C "$root" worktree remove --force "$tmp/base" >/dev/null 2>&1 || true
  rm -rf "$tmp"
}
trap cleanup EXIT
git -C "$root" worktree add --quiet --detach "$tmp/base" "$base"
cp "$root"/bench/fairness/*_test.go "$tmp/base/bench/fairness/"
(cd "$tmp/base" && go test -c -o "$tmp/before.test" ./bench/fairness/)
(cd "$root" && go test -c -o "$tmp/after.test" ./bench/fairness/)
echo "before: $(git -C "$root" rev-parse --short "$base"), after: $(git -C "$root" rev-parse --short HEAD)$(git -C "$root" diff --quiet HEAD || echo ' + uncommitted changes')"
for i in $(seq "$runs"); do
  for v in before after; do
    echo "== $v, run $i, $(date -u +%H:%M:%S) UTC, load average $(cut -d' ' -f1-3 /proc/loadavg)"
    (cd "$root/bench/fairness" && LOOPS_BENCH=1 "$tmp/$v.test" -test.run "${TEST:-^TestSamplingFairness$}" -test.v -test.count=1 -test.timeout 1h) | grep -v '^=== ' || true
  done
done
