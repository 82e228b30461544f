#!/usr/bin/env bash
# tests/cookbook/venv.sh -> prints the path of a venv with tinker-cookbook 0.6.1 (math-rl extra),
# tinker 0.38.0, pytest and peft (the torch worker's pin: test_weights.py loads the cookbook's
# build_lora_adapter output with it). tinker-cookbook requires torch>=2.10; torch is taken from the
# existing torch venv through tests/sdk_matrix/torch_overlay.sh (no 5 GB download) when that
# venv exists, otherwise pip installs it from PyPI.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cookbook=${LOOPS_COOKBOOK_VERSION:-0.6.1}
tinker=${LOOPS_COOKBOOK_TINKER:-0.38.0}
venv=$("$root/scripts/pyenv.sh" "cookbook-$cookbook" "tinker==$tinker" pytest pytest-timeout numpy)
peft=$(grep -E '^peft==' "$root/backends/torch/requirements-cpu.txt")
want="tinker-cookbook[math-rl]==$cookbook tinker==$tinker $peft"
stamp=$venv/.loops-cookbook
if [[ -f $stamp && "$(cat "$stamp")" == "$want" ]]; then
  echo "$venv"; exit 0
fi
exec 9>"$venv/.loops-cookbook.lock"
command -v flock >/dev/null && flock 9
if [[ -f $stamp && "$(cat "$stamp")" == "$want" ]]; then
  echo "$venv"; exit 0
fi
echo "cookbook venv: installing $want into $venv" >&2
"$here/../sdk_matrix/torch_overlay.sh" "$venv" >&2 || echo "cookbook venv: no torch venv to reuse; pip will install torch" >&2
if ! "$venv/bin/python" -m pip install --disable-pip-version-check -q "tinker-cookbook[math-rl]==$cookbook" "tinker==$tinker" "$peft" >&2; then
  # tinker-cookbook 0.6.1 requires tml-renderers>=0.4.1, which the package index may not
  # carry (PyPI as mirrored here stops at 0.2.1). tml_renderers is imported lazily, only for
  # TML ("Inkling") models, so install the cookbook without it: --no-deps, then every other
  # requirement (base + math-rl extra) read from the installed wheel's metadata.
  echo "cookbook venv: full install failed; installing without tml-renderers" >&2
  "$venv/bin/python" -m pip install --disable-pip-version-check -q --no-deps "tinker-cookbook==$cookbook" >&2
  mapfile -t reqs < <("$venv/bin/python" - <<'PY'
import importlib.metadata as md
from packaging.requirements import Requirement
for line in md.requires("tinker-cookbook") or []:
    r = Requirement(line)
    if r.name in ("tml-renderers", "tinker"):
        continue
    if r.marker is None or r.marker.evaluate({"extra": "math-rl"}):
        print(str(r).split(";")[0].strip())
PY
)
  "$venv/bin/python" -m pip install --disable-pip-version-check -q "tinker==$tinker" "$peft" "${reqs[@]}" >&2
fi
printf '%s\n' "$want" >"$stamp"
echo "$venv"
