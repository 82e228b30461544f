#!/usr/bin/env bash
# clients/ts/run.sh: the TypeScript client test. Installs the pinned npm packages (npm ci),
# checks that gen/ts matches proto/ (regenerating into a temporary folder), type-checks
# sft.ts and gen/ts, starts a `loops serve` (clients/with-server.sh; set LOOPS_URL to use a
# running one) and runs sft.ts: a 3-step SFT loop over Connect whose loss must fall, then a
# sample. Exits non-zero on failure.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
"$here/install.sh"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/loops-ts-gen.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
"$here/generate.sh" "$tmp"
if ! diff -r -x node_modules -x .gitignore "$tmp/gen/ts" "$root/gen/ts" >"$tmp/diff"; then
  head -40 "$tmp/diff" >&2
  echo "clients/ts: gen/ts is stale: run make generate-ts" >&2
  exit 1
fi
cd "$here"
npx --no-install tsc --noEmit -p .
"$root/clients/with-server.sh" npx --no-install tsx sft.ts
