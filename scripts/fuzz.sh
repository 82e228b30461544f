#!/usr/bin/env bash
# Runs every Go fuzz target in the module for a fixed budget each: FUZZTIME (default 15s),
# or FUZZTIME_<Target> for one target (e.g. FUZZTIME_FuzzCore=60s). `go test -fuzz` takes
# one target per run, so the targets are found in the _test.go files and run one by one.
# A failure leaves the failing input under the package's testdata/fuzz/ and stops here.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
default=${FUZZTIME:-15s}
total=0
while IFS=: read -r file name; do
  pkg=./$(dirname "$file")
  var="FUZZTIME_${name}"
  budget=${!var:-$default}
  echo "fuzz: $name in $pkg for $budget"
  # Minimizing a new interesting input may take up to -fuzzminimizetime (60 s by default);
  # past -fuzztime that is reported as "context deadline exceeded", so keep it short.
  $GO test -run '^$' -fuzz "^${name}\$" -fuzztime "$budget" -fuzzminimizetime "${FUZZMINIMIZETIME:-2s}" -parallel "${FUZZPARALLEL:-2}" "$pkg"
  total=$((total + 1))
done < <(git ls-files '*_test.go' | xargs grep -H -o '^func Fuzz[A-Za-z0-9_]*' | sed 's/:func /:/' | sort)
echo "fuzz: $total targets passed"
