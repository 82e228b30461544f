#!/usr/bin/env bash
# tests/sdk_matrix/run.sh [PYTEST_ARGS...]
#
# Runs tests/sdk_matrix once per tinker release, each in its own venv
# (scripts/pyenv.sh sdk-tinker-<ver> ...), against a fresh `loops serve` per release,
# then writes the feature x version table to tests/sdk_matrix/MATRIX.md (and prints it).
#
#   LOOPS_SDK_VERSIONS  releases to test (default "0.18.2 0.24.1 0.30.4 0.38.0")
#   LOOPS_SDK_TORCH     1 (default): make torch importable in each venv by linking the one
#                       in $LOOPS_VENV_DIR/tinker-0.38.0-torch (torch_overlay.sh), so
#                       forward_backward_custom runs; 0: no torch, that column is n/a
#   LOOPS_SDK_MATRIX    where to write the table (default tests/sdk_matrix/MATRIX.md)
#   LOOPS_SDK_SURFACE   where to write the surface table (default tests/sdk_matrix/SURFACE.md)
#   LOOPS_SDK_TESTS     what pytest runs (default tests/sdk_matrix: feature cells and the
#                       surface test; tests/sdk_matrix/test_surface.py for the surface alone)
#   LOOPS_E2E_BIN       a prebuilt loops binary (default: go build once into a temp dir)
# Exit status: 0 when no cell failed and no surface item is failing or unclassified.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
versions=${LOOPS_SDK_VERSIONS:-"0.18.2 0.24.1 0.30.4 0.38.0"}
work=$(mktemp -d "${TMPDIR:-/tmp}/loops-sdk-matrix.XXXXXX")
trap 'rm -rf "$work"' EXIT
results=$work/results
mkdir -p "$results"

if [[ -z ${LOOPS_E2E_BIN:-} ]]; then
  (cd "$root" && go build -o "$work/loops" ./cmd/loops) || { echo "go build failed" >&2; exit 2; }
  export LOOPS_E2E_BIN=$work/loops
fi

status=0
for v in $versions; do
  venv=$("$root/scripts/pyenv.sh" "sdk-tinker-$v" "tinker==$v" pytest pytest-timeout numpy transformers) || { status=1; continue; }
  site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  if [[ ${LOOPS_SDK_TORCH:-1} == 1 ]]; then
    "$here/torch_overlay.sh" "$venv" >/dev/null || echo "sdk-matrix: no torch venv to link; forward_backward_custom will be n/a" >&2
  else
    rm -f "$site/zz-loops-torch-overlay.pth"
  fi
  echo "=== tinker $v ($venv)" >&2
  start=$(date +%s)
  (cd "$root" && LOOPS_SDK_RESULTS=$results "$venv/bin/python" -m pytest -c tests/sdk_matrix/pytest.ini \
      --rootdir tests/sdk_matrix ${LOOPS_SDK_TESTS:-tests/sdk_matrix} "$@") || status=1
  echo "=== tinker $v: $(( $(date +%s) - start )) s" >&2
done
out=${LOOPS_SDK_MATRIX:-$here/MATRIX.md}
if python3 "$here/matrix.py" "$results" >"$work/matrix.md"; then cp "$work/matrix.md" "$out" && cat "$out"; fi
if compgen -G "$results/surface-*.json" >/dev/null; then
  surface=${LOOPS_SDK_SURFACE:-$here/SURFACE.md}
  python3 "$here/surface.py" "$results" >"$surface" && sed -n '/^| tinker | items/,/^$/p' "$surface"
  echo "surface table: $surface" >&2
fi
exit $status
