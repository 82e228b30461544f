#!/usr/bin/env bash
# backends/torch/run-tests.sh (make test-torch): builds/reuses the worker venv
# (scripts/pyenv.sh torch-worker ...), writes loops/tiny, runs the Python tests, then the Go worker tests
# (backends/worker) with LOOPS_TEST_TORCH=1: reference-equality, failure handling and the
# backend contract suite through the Go client against a local CPU worker.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
venv=$("$root/scripts/pyenv.sh" torch-worker $(cat "$root/backends/torch/requirements-cpu.txt"))
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# loops/tiny, as the Go side writes it, for the tests that compare on it (test_shard.py)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$root" && ${GO:-go} run ./bench/reference/cmd/fbbench -write-tiny "$tmp/loops-tiny")
export LOOPS_TINY_DIR="$tmp/loops-tiny"
(cd "$root/backends/torch" && PYTHONPATH="$root/backends/torch:$root/gen/python" "$venv/bin/python" -m pytest -q -p no:warnings -p no:cacheprovider tests)
cd "$root"
LOOPS_TEST_TORCH=1 LOOPS_WORKER_PYTHON="$venv/bin/python" ${GO:-go} test -count=1 -timeout 20m ./backends/worker/...
