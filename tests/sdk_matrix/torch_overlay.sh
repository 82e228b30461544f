#!/usr/bin/env bash
# tests/sdk_matrix/torch_overlay.sh VENV
#
# Makes torch importable in VENV without installing it again (torch from PyPI is a
# ~5 GB CUDA build; there is no CPU-only wheel there). It links torch and the packages
# only torch needs (nvidia-*, cuda-*, triton, sympy, mpmath, networkx, jinja2,
# markupsafe, filelock, fsspec) from an existing torch venv into a shared overlay folder
# and adds a .pth file to VENV that appends the overlay to sys.path (unless the
# environment has LOOPS_NO_TORCH_OVERLAY). A .pth entry goes
# *after* VENV's own site-packages, so every package VENV installed itself (tinker,
# numpy, transformers, ...) still wins; pip also sees torch as installed, so a later
# `pip install` of something that requires torch does not download it.
#
# The torch venv is ${LOOPS_TORCH_VENV:-$LOOPS_VENV_DIR/tinker-0.38.0-torch} (what
# `LOOPS_E2E_TORCH=1 tests/e2e/run.sh` builds), or else the torch worker's venv
# ($LOOPS_VENV_DIR/torch-worker, CPU torch). Prints the torch version on stdout,
# or exits 3 (and prints nothing) when no torch venv exists.
set -euo pipefail
venv=${1:?usage: torch_overlay.sh VENV}
root=${LOOPS_VENV_DIR:-$HOME/.cache/loops/venvs}
tv=${LOOPS_TORCH_VENV:-$root/tinker-0.38.0-torch}
pyver=$("$venv/bin/python" -c 'import sys; print(f"python{sys.version_info[0]}.{sys.version_info[1]}")')
src=$tv/lib/$pyver/site-packages
if [[ ! -d $src/torch && -z ${LOOPS_TORCH_VENV:-} ]]; then
  tv=$root/torch-worker
  src=$tv/lib/$pyver/site-packages
fi
[[ -d $src/torch ]] || exit 3
overlay=$root/.torch-overlay-$(basename "$tv")-$pyver
if [[ ! -f $overlay/.complete ]]; then
  rm -rf "$overlay" && mkdir -p "$overlay"
  shopt -s nullglob
  for p in "$src"/{torch,torchgen,functorch,triton,nvidia,cuda,sympy,mpmath,networkx,jinja2,markupsafe,filelock,fsspec} \
           "$src"/{torch,triton,nvidia_,cuda_,sympy,mpmath,networkx,jinja2,markupsafe,MarkupSafe,filelock,fsspec}*.dist-info \
           "$src"/isympy.py; do
    ln -sfn "$p" "$overlay/$(basename "$p")"
  done
  touch "$overlay/.complete"
fi
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
# An `import` line in a .pth file is executed at start-up: the overlay is appended unless
# LOOPS_NO_TORCH_OVERLAY is set (the CLI tests set it: importing torch costs seconds per call).
echo "import os, sys; 'LOOPS_NO_TORCH_OVERLAY' in os.environ or sys.path.append('$overlay')" \
  >"$site/zz-loops-torch-overlay.pth"
"$venv/bin/python" -c 'import torch; print(torch.__version__)'
