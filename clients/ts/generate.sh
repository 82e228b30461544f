#!/usr/bin/env bash
# clients/ts/generate.sh [OUT]: regenerate the TypeScript code for loops.v1 (gen/ts) with buf
# and the protoc-gen-es pinned in package-lock.json (buf.gen.yaml here). With OUT, generate
# into OUT/gen/ts instead (run.sh diffs that against gen/ts). Needs `make protodeps` first.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
"$here/install.sh"
cd "$root"
buf=(go tool -modfile=tools/go.mod buf)
if [[ $# -ge 1 ]]; then
  "${buf[@]}" generate --template clients/ts/buf.gen.yaml -o "$1"
else
  rm -rf gen/ts/loops gen/ts/google
  "${buf[@]}" generate --template clients/ts/buf.gen.yaml
fi
