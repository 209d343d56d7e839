#!/usr/bin/env bash
# Optional: creates a venv with llama-cpp-python (the PyPI sdist, which compiles llama.cpp for this CPU),
# the peer `pagedserve bench --peers llamacpp` runs against and the logits comparison test reads.
# Never part of the default setup or of CI (the compile takes ~15 min on 2 cores).
#
# Usage: ops/peers/setup_llamacpp.sh [VENV]   (default: $LLAMACPP_VENV, else .venv-llamacpp at the repo root)
#
# Why its own venv: the peer must not share a process (or a numpy/torch pin) with pagedserve; the bench runs
# it as a subprocess with this venv's python, as it does vLLM.
# The build is CPU only and native: GGML_NATIVE compiles for this CPU's ISA (AVX2/FMA on the EPYC), the same
# cores pagedserve's own kernels are built for, so the comparison is like for like.
# Safe to run again: it reinstalls only when this script or the version changed.
set -euo pipefail
cd "$(dirname "$0")/../.."

version=${LLAMACPP_PYTHON_VERSION:-0.3.36}
venv=${1:-${LLAMACPP_VENV:-.venv-llamacpp}}
py=${PYTHON:-}
if [ -z "$py" ]; then
  for candidate in python3.11 python3.12 python3; do
    if command -v "$candidate" >/dev/null 2>&1; then py=$candidate; break; fi
  done
fi
[ -n "$py" ] || { echo "setup_llamacpp: no python3 found (need Python >= 3.11)" >&2; exit 1; }

# The sdist builds with CMake and a C++ compiler; install them where apt can.
missing=()
command -v cmake >/dev/null 2>&1 || missing+=(cmake)
command -v c++ >/dev/null 2>&1 || missing+=(g++)
command -v ninja >/dev/null 2>&1 || missing+=(ninja-build)
if [ ${#missing[@]} -gt 0 ]; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "setup_llamacpp: installing ${missing[*]}" >&2
    apt-get install -y "${missing[@]}" >&2
  else
    echo "setup_llamacpp: missing ${missing[*]} (install them, then run again)" >&2
    exit 1
  fi
fi

stamp=$venv/.llamacpp-installed
want=$( (sha256sum ops/peers/setup_llamacpp.sh; echo "$version") | sha256sum | cut -c1-16)
if [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
  echo "setup_llamacpp: $venv already has llama-cpp-python $version" >&2
  exit 0
fi
[ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
pip=("$venv/bin/pip" --disable-pip-version-check)

export CMAKE_ARGS="-DGGML_NATIVE=ON -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DGGML_OPENMP=ON \
-DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF"
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}
echo "setup_llamacpp: building llama-cpp-python $version into $venv (CMAKE_ARGS=$CMAKE_ARGS)" >&2
"${pip[@]}" install --quiet --upgrade pip >&2
# --no-binary: always the sdist, compiled here, never a prebuilt wheel for another CPU.
# [server]: `python -m llama_cpp.server`, for `pagedserve bench serve` against its OpenAI API.
"${pip[@]}" install --verbose --no-cache-dir --no-binary llama-cpp-python "llama-cpp-python[server]==$version"
"$venv/bin/python" -c 'import llama_cpp; print("setup_llamacpp: llama_cpp", llama_cpp.__version__, llama_cpp.llama_print_system_info().decode())'
echo "$want" > "$stamp"
