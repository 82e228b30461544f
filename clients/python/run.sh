#!/usr/bin/env bash
# clients/python/run.sh: the Python client test. Checks that gen/python matches proto/
# (scripts/gen-python.sh into a temporary folder), creates/reuses a cached venv with grpcio,
# protobuf and googleapis-common-protos (scripts/pyenv.sh), starts a `loops serve`
# (clients/with-server.sh; set LOOPS_URL to use a running one) and runs sft.py over gRPC with
# the stubs in gen/python: a 3-step SFT loop whose loss must fall, then a sample. Exits
# non-zero on failure.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/loops-py-gen.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
GEN_PYTHON_OUT=$tmp "$root/scripts/gen-python.sh" 2>/dev/null
if ! diff -r -x __pycache__ "$tmp/loops" "$root/gen/python/loops" >"$tmp/diff"; then
  head -40 "$tmp/diff" >&2
  echo "clients/python: gen/python is stale: run scripts/gen-python.sh" >&2
  exit 1
fi
# The same protobuf runtime as the generator (scripts/gen-python.sh) pins.
venv=$("$root/scripts/pyenv.sh" loops-client-python \
  grpcio==1.85.1 protobuf==7.36.2 googleapis-common-protos==1.76.0)
"$root/clients/with-server.sh" "$venv/bin/python" "$here/sft.py"
