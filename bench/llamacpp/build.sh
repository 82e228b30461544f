#!/usr/bin/env bash
# Builds llama.cpp's llama-server from the llama.cpp tree that the llama-cpp-python sdist on
# PyPI vendors (vendor/llama.cpp), once per version, into the cache:
#
#   $LLAMACPP_CACHE/<version>/src/        the unpacked sdist (its vendor/llama.cpp holds the
#                                         converter convert_hf_to_gguf.py and gguf-py)
#   $LLAMACPP_CACHE/<version>/bin/llama-server
#
# LLAMACPP_CACHE defaults to ~/.cache/loops/llama.cpp; LLAMACPP_VERSION (a llama-cpp-python
# release, default below) picks the sdist; JOBS (default 2) the compile jobs, run under
# nice -n 10. A second run with the binary present does nothing. Prints the binary's path.
#
#   PYTHON=~/.cache/loops/venvs/torch-worker/bin/python bash bench/llamacpp/build.sh
set -euo pipefail

version="${LLAMACPP_VERSION:-0.3.36}"
cache="${LLAMACPP_CACHE:-$HOME/.cache/loops/llama.cpp}"
jobs="${JOBS:-2}"
python="${PYTHON:-python3}"
root="$cache/$version"
bin="$root/bin/llama-server"

if [[ -x "$bin" ]]; then
  echo "$bin"
  exit 0
fi

mkdir -p "$root"
exec 9>"$root/.lock"
flock 9
if [[ -x "$bin" ]]; then # built by another run while this one waited
  echo "$bin"
  exit 0
fi

src="$root/src"
if [[ ! -f "$src/vendor/llama.cpp/CMakeLists.txt" ]]; then
  dl="$root/dl"
  mkdir -p "$dl"
  "$python" -m pip download --no-binary :all: --no-deps -d "$dl" "llama-cpp-python==$version" >&2
  rm -rf "$src" "$root/unpack"
  mkdir -p "$root/unpack"
  tar xzf "$dl/llama_cpp_python-$version.tar.gz" -C "$root/unpack"
  mv "$root/unpack/llama_cpp_python-$version" "$src"
  rm -rf "$root/unpack" "$dl"
fi

cmake_bin="${CMAKE:-$(command -v cmake || true)}"
if [[ -z "$cmake_bin" ]]; then # Debian's cmake missing: PyPI's
  "$python" -m pip install --target "$root/cmake-pypi" cmake >&2
  cmake_bin="$root/cmake-pypi/bin/cmake"
  export PYTHONPATH="$root/cmake-pypi${PYTHONPATH:+:$PYTHONPATH}"
fi

build="$root/build"
# CPU only, native flags (-march=native: the machine's AVX2/AVX-512), OpenMP threads, one
# static binary, no web UI (its prebuilt assets would come from the Hugging Face hub), no TLS;
# unity builds for the host-side C++ libraries (unity.cmake), not for ggml's kernels.
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
nice -n 10 "$cmake_bin" -S "$src/vendor/llama.cpp" -B "$build" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PROJECT_INCLUDE="$here/unity.cmake" \
  -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=ON -DGGML_OPENMP=ON \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON \
  -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF >&2
nice -n 10 "$cmake_bin" --build "$build" --target llama-server -j "$jobs" >&2
mkdir -p "$root/bin"
cp "$build/bin/llama-server" "$bin.tmp"
mv "$bin.tmp" "$bin"
rm -rf "$build"
echo "$bin"
