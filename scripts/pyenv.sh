#!/usr/bin/env bash
# scripts/pyenv.sh NAME REQUIREMENT...
#
# Creates (or reuses) a Python virtual environment named NAME under
# ${LOOPS_VENV_DIR:-$HOME/.cache/loops/venvs}/NAME with the given pip
# requirements installed, and prints the venv path on stdout (nothing else goes
# to stdout, so `VENV=$(scripts/pyenv.sh ...)` works).
#
# The venv is reused when its stamp file records exactly the same requirement
# list (order-insensitive) and the same interpreter; otherwise it is rebuilt
# from scratch. A cached hit costs one file comparison (no pip call).
#
# Environment:
#   LOOPS_VENV_DIR   parent folder of the venvs (default ~/.cache/loops/venvs)
#   LOOPS_PYTHON     interpreter used to create the venv (default: python3,
#                    must be >= 3.11 for the tinker SDK)
#   LOOPS_PYENV_PROGRESS=1  show pip's own progress (each package collected and
#                    installed) on stderr instead of building quietly
#   LOOPS_PYENV_BEFORE_INSTALL  a command run with the new venv's path as its last
#                    argument after the venv is made and before pip installs (e.g. to
#                    link torch in, so that pip does not download it)
#   PIP_INDEX_URL etc. are honoured by pip as usual.
#
# Example:
#   VENV=$(scripts/pyenv.sh tinker-0.38.0 tinker==0.38.0 pytest numpy)
#   "$VENV/bin/python" -m pytest tests/e2e
set -euo pipefail

usage() {
  echo "usage: $0 NAME REQUIREMENT..." >&2
  exit 2
}

[[ $# -ge 2 ]] || usage
name=$1
shift
case "$name" in
  "" | */* | .*) echo "pyenv.sh: invalid venv name: '$name'" >&2; exit 2 ;;
esac

root=${LOOPS_VENV_DIR:-$HOME/.cache/loops/venvs}
venv=$root/$name
stamp=$venv/.loops-requirements
python=${LOOPS_PYTHON:-python3}

if ! command -v "$python" >/dev/null 2>&1; then
  echo "pyenv.sh: interpreter '$python' not found (set LOOPS_PYTHON)" >&2
  exit 1
fi

# Canonical description of what we want: interpreter version + sorted requirements.
want=$(
  "$python" -c 'import sys; print("python", ".".join(map(str, sys.version_info[:3])), sys.executable)'
  printf '%s\n' "$@" | LC_ALL=C sort -u
)

if [[ -f $stamp && -x $venv/bin/python ]] && [[ "$(cat "$stamp")" == "$want" ]]; then
  echo "$venv"
  exit 0
fi

mkdir -p "$root"
# Serialize concurrent builders of the same venv.
lock=$root/.$name.lock
exec 9>"$lock"
if command -v flock >/dev/null 2>&1; then
  flock 9
  # Someone else may have finished building it while we waited.
  if [[ -f $stamp && -x $venv/bin/python ]] && [[ "$(cat "$stamp")" == "$want" ]]; then
    echo "$venv"
    exit 0
  fi
fi

echo "pyenv.sh: building $venv" >&2
quiet=-q
if [[ ${LOOPS_PYENV_PROGRESS:-} == 1 ]]; then
  quiet=
  echo "pyenv.sh: installing $# requirement(s): $*" >&2
fi
# Create at the final path (console-script shebangs embed it); the stamp is
# written last, so a failed or interrupted build is never reused.
rm -rf "$venv"
"$python" -m venv "$venv" >&2
if [[ -n ${LOOPS_PYENV_BEFORE_INSTALL:-} ]] && ! bash -c "$LOOPS_PYENV_BEFORE_INSTALL \"\$1\"" pyenv "$venv" >&2; then
  echo "pyenv.sh: LOOPS_PYENV_BEFORE_INSTALL failed; removing $venv" >&2
  rm -rf "$venv"
  exit 1
fi
if ! "$venv/bin/python" -m pip install --disable-pip-version-check -q --upgrade pip >&2 ||
   ! "$venv/bin/python" -m pip install --disable-pip-version-check $quiet "$@" >&2; then
  echo "pyenv.sh: pip install failed; removing $venv" >&2
  rm -rf "$venv"
  exit 1
fi
printf '%s\n' "$want" >"$stamp"
echo "$venv"
