#!/usr/bin/env bash
# Optional: creates a venv with llama-cpp-python (the PyPI sdist, which compiles llama.cpp for this CPU),
# the peer `pagedserve bench --peers llamacpp` runs against and the logits comparison test reads.
# Never part of the default setup or of CI (the compile takes ~15 min on 2 cores).
#
# Usage: ops/peers/setup_llamacpp.sh [VENV]   (default: $LLAMACPP_VENV, else .venv-llamacpp at the repo root)
#
# Why its own venv: the peer must not share a process (or a numpy/torch pin) with pagedserve; the bench runs
# it as a subprocess with this venv's python, as it does vLLM.
# The build is CPU only and for this CPU's ISA (AVX2/FMA on the EPYC; AVX-512/VNNI without AMX on the
# Intel Xeon, see below), the cores pagedserve's own kernels are built for, so the comparison is like for
# like. It also builds llama.cpp's own `llama-server` (slots, continuous batching) from the same sdist.
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

# GGML_NATIVE compiles for this CPU's ISA, except on a CPU with AMX-INT8: there ggml's AMX matmul
# (ggml_backend_amx_mul_mat) died of SIGSEGV on the bundled Q4_1 model at its first batch, in the
# binding and in llama-server alike (Intel Xeon, family 6 model 167, 0.3.36), so the same ISA is
# named flag by flag with AMX left out; the AVX-512/VNNI repacked kernels still run.
isa="-DGGML_NATIVE=ON"
cpu_flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true)
if [[ " $cpu_flags " == *" amx_int8 "* ]]; then
  isa="-DGGML_NATIVE=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
  for pair in avx:AVX avx2:AVX2 fma:FMA f16c:F16C bmi2:BMI2 avx_vnni:AVX_VNNI avx512f:AVX512 \
              avx512vbmi:AVX512_VBMI avx512_vnni:AVX512_VNNI avx512_bf16:AVX512_BF16; do
    flag=${pair%%:*}
    option=${pair#*:}
    if [[ " $cpu_flags " == *" $flag "* ]]; then isa="$isa -DGGML_$option=ON"; else isa="$isa -DGGML_$option=OFF"; fi
  done
fi
export CMAKE_ARGS="$isa -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DGGML_OPENMP=ON \
-DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF"
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}
echo "setup_llamacpp: building llama-cpp-python $version into $venv (CMAKE_ARGS=$CMAKE_ARGS)" >&2
"${pip[@]}" install --quiet --upgrade pip >&2
# The sdist is unpacked and built from a folder we keep, into a build folder we keep: the same
# compiled ggml/llama objects then also make llama.cpp's own `llama-server` below.
# --no-binary: always the sdist, compiled here, never a prebuilt wheel for another CPU.
src_root=$venv/src
build_dir=$venv/build
rm -rf "$src_root" "$build_dir"
mkdir -p "$src_root"
"${pip[@]}" download --quiet --no-deps --no-binary :all: -d "$src_root" "llama-cpp-python==$version" >&2
tar -xzf "$src_root"/llama_cpp_python-"$version".tar.gz -C "$src_root"
src=$src_root/llama_cpp_python-$version
# A rerun (a changed script) must rebuild: an installed copy of the same version would satisfy pip.
"${pip[@]}" uninstall --quiet -y llama-cpp-python >/dev/null 2>&1 || true
# [server]: `python -m llama_cpp.server`, for `pagedserve bench serve` against its OpenAI API.
"${pip[@]}" install --verbose --no-cache-dir --config-settings=build-dir="$(realpath "$build_dir")" "$src[server]"
"$venv/bin/python" -c 'import llama_cpp; print("setup_llamacpp: llama_cpp", llama_cpp.__version__, llama_cpp.llama_print_system_info().decode())'

# llama.cpp's own server (parallel slots, continuous batching): the peer `bench serve --peer-llamacpp`
# prefers, since llama_cpp.server runs one request at a time. The binding's build turns llama.cpp's
# tools off; turn them on in the same build folder and build that one target. LLAVA_BUILD=OFF: the
# binding adds tools/mtmd itself, and llama.cpp's tools folder adds it again (CMake refuses the pair).
# No web UI: it would be downloaded, and the bench needs only the API.
cmake -S "$src" -B "$build_dir" -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON -DLLAVA_BUILD=OFF \
  -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF >"$venv/llama-server-configure.log" 2>&1 \
  || { tail -30 "$venv/llama-server-configure.log" >&2; exit 1; }
cmake --build "$build_dir" --target llama-server -j "$CMAKE_BUILD_PARALLEL_LEVEL" >"$venv/llama-server-build.log" 2>&1 \
  || { tail -30 "$venv/llama-server-build.log" >&2; exit 1; }
server_bin=$(find "$build_dir" -type f -name llama-server -perm -u+x | head -1)
[ -n "$server_bin" ] || { echo "setup_llamacpp: llama-server was not built (see $venv/llama-server-build.log)" >&2; exit 1; }
ln -sf "$(realpath "$server_bin")" "$venv/bin/llama-server"
"$venv/bin/llama-server" --version >&2
echo "$want" > "$stamp"
