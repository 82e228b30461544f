#!/usr/bin/env bash
# tests/skyrl/run.sh: `loops conformance` against SkyRL's Tinker-compatible server and
# against `loops serve`, side by side, written as the cross-server matrix
# docs/conformance-skyrl.md (see tests/skyrl/README.md). Not part of `make test`: SkyRL
# needs its own venv (JAX, a few hundred MB) and a run takes about ten minutes on 2 cores.
#
#   make conformance-skyrl            # = bash tests/skyrl/run.sh
#
# Environment: SKYRL_VERSION (default 0.3.0, the newest on PyPI), SKYRL_TINKER (the tinker
# SDK SkyRL imports its protobuf and types from; default 0.24.1, as its lock file pins
# 0.24.x), LOOPS_SKYRL_OUT (default docs/conformance-skyrl.md).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
version=${SKYRL_VERSION:-0.3.0}
tinker=${SKYRL_TINKER:-0.24.1}
out=${LOOPS_SKYRL_OUT:-docs/conformance-skyrl.md}
work=$(mktemp -d /tmp/loops-skyrl.XXXXXX)
# The reports and both servers' logs are kept here (the work folder is removed).
logs=${LOOPS_SKYRL_LOGS:-$root/tests/skyrl/last-run}
rm -rf "$logs" && mkdir -p "$logs"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

# The venv: torch comes from the torch-worker overlay before pip runs (peft requires torch;
# PyPI has only the multi-GB CUDA build), so pip does not fetch it again.
export LOOPS_PYENV_BEFORE_INSTALL="bash $root/tests/sdk_matrix/torch_overlay.sh"
venv=$(scripts/pyenv.sh "skyrl-$version" "skyrl[tinker,jax]==$version" "tinker==$tinker")
go build -o "$work/loops" ./cmd/loops
loops_rev=$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . ':!docs' || echo "+changes")

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_up() { # URL LOG PID
  for _ in $(seq 1 180); do
    curl -sf "$1/api/v1/healthz" >/dev/null && return 0
    kill -0 "$3" 2>/dev/null || { echo "server exited:"; tail -40 "$2"; return 1; }
    sleep 1
  done
  echo "server did not come up:"; tail -40 "$2"; return 1
}

# Loops, with two keys in two workspaces (the isolation cases) and its body limit known.
lport=$(port)
"$work/loops" serve --addr "127.0.0.1:$lport" --data-dir "$work/loops-data" \
  --api-key tml-conformance-a=team-a --api-key tml-conformance-b=team-b >"$work/loops.log" 2>&1 &
pids+=($!)
wait_up "http://127.0.0.1:$lport" "$work/loops.log" "${pids[-1]}"

# SkyRL serves the same model: loops/tiny as loops serve writes it (a Qwen3-shaped
# checkpoint with its tokenizer), from a local folder (no hub here).
model=$work/loops-tiny
cp -r "$work/loops-data/models/loops-tiny" "$model"
sport=$(port)
(cd "$work" && "$venv/bin/python" "$root/tests/skyrl/serve_skyrl.py" --base-model "$model" --backend jax \
  --backend-config '{"max_lora_adapters": 96, "max_lora_rank": 64}' \
  --database-url "sqlite:///$work/skyrl.sqlite" --checkpoints-base "$work/skyrl-ckpts" \
  --port "$sport" >"$work/skyrl.log" 2>&1) &
pids+=($!)
wait_up "http://127.0.0.1:$sport" "$work/skyrl.log" "${pids[-1]}"

run() { # NAME URL MODEL ARGS...
  local name=$1 url=$2 model=$3
  shift 3
  echo "conformance: $name ($url)" >&2
  "$work/loops" conformance --target "$url" --base-model "$model" --json --timeout 3m "$@" \
    >"$work/$name.json" 2>"$work/$name.err" || true
  echo "  $(python3 tests/skyrl/matrix.py --counts "$work/$name.json")" >&2
}
run loops-json "http://127.0.0.1:$lport" loops/tiny --api-key tml-conformance-a --other-api-key tml-conformance-b --sdk-only --wire json
run loops-proto "http://127.0.0.1:$lport" loops/tiny --api-key tml-conformance-a --other-api-key tml-conformance-b
# The JSON wire first: it is the one SkyRL 0.3.0 was written for.
run skyrl-json "http://127.0.0.1:$sport" "$model" --api-key tml-conformance-a --open --sdk-only --wire json
run skyrl-proto "http://127.0.0.1:$sport" "$model" --api-key tml-conformance-a --open
if ! kill -0 "${pids[-1]}" 2>/dev/null || ! curl -sf "http://127.0.0.1:$sport/api/v1/healthz" >/dev/null; then
  echo "SkyRL's server is no longer answering after the runs (its log: $logs/skyrl.log)" >&2
  skyrl_alive="SkyRL's server had stopped answering by the end of the protobuf run (see its log)."
else
  skyrl_alive="SkyRL's server still answered its health check after both runs."
fi
cp "$work"/*.json "$work"/*.log "$logs/" 2>/dev/null || true

python3 tests/skyrl/matrix.py "$out" \
  "Loops $loops_rev=$work/loops-proto.json" "SkyRL $version=$work/skyrl-proto.json" \
  --note "# Cross-server conformance: Loops and SkyRL" \
  --note "" \
  --note "Written by \`tests/skyrl/run.sh\` ($(date -u +%Y-%m-%d)): \`loops conformance\` (the SDK-level checks, then every protocol case with a Tinker form; docs/conformance.md) against \`loops serve\` (Loops $loops_rev, two keys in two workspaces) and SkyRL's Tinker-compatible server (\`skyrl[tinker,jax]==$version\` from PyPI, JAX backend on CPU, tinker $tinker for its types, \`max_lora_adapters\` 96, started by tests/skyrl/serve_skyrl.py), both serving the same model (loops/tiny's checkpoint, a Qwen3-shaped model, from a local folder). The wire is tinker 0.38's: protobuf forward_backward bodies and results. SkyRL is run in open mode (it checks no keys), so its isolation cases are skipped. $skyrl_alive" \
  --note "" \
  --note "SDK-level checks on tinker ≤ 0.24's JSON forward_backward wire (\`--wire json --sdk-only\`): Loops $(python3 tests/skyrl/matrix.py --counts "$work/loops-json.json"), SkyRL $(python3 tests/skyrl/matrix.py --counts "$work/skyrl-json.json"); SkyRL's failures: $(python3 tests/skyrl/matrix.py --failures "$work/skyrl-json.json")."
echo "wrote $out; reports and logs in $logs" >&2
