#!/usr/bin/env bash
# clients/ts/install.sh: `npm ci` from package-lock.json (pinned versions; ~/.npm caches the
# downloads), skipped when node_modules already matches the lock file. Links
# gen/ts/node_modules (git-ignored) to clients/ts/node_modules, so the generated code in gen/ts
# resolves @bufbuild/protobuf from here.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cd "$here"
stamp=node_modules/.loops-package-lock.json
if ! cmp -s package-lock.json "$stamp" 2>/dev/null; then
  npm ci --no-audit --no-fund --prefer-offline >&2
  cp package-lock.json "$stamp"
fi
ln -sfn ../../clients/ts/node_modules "$root/gen/ts/node_modules"
