#!/usr/bin/env bash
# GPU check of the Triton attention kernels, for a machine with a CUDA GPU. About 5-8 minutes:
#   1. pagedserve.ops.gpu.check: correctness sweep compiled for real (vs dense reference and torch backend),
#      then decode attention timed against the torch backend, bandwidth as a fraction of peak;
#   2. the Triton kernel unit tests compiled for real (when pytest and hypothesis are installed);
#   3. `pagedserve bench --attention-backend triton --device cuda` (when that command exists here).
# Results go to bench/results/gpu/ (and to $OUT too, when set). Needs only torch + triton for step 1.
# Env: PYTHON (default python3), PAGEDSERVE_PEAK_TBS (peak HBM TB/s, for a device not in the table).
set -uo pipefail
cd "$(dirname "$0")/.."

py=${PYTHON:-python3}
results=bench/results/gpu
mkdir -p "$results"
export TRITON_INTERPRET=0 TRITON_DEFAULT_FP_FUSION=1
# This checkout as the `pagedserve` package without installing it (the GPU image has torch and triton,
# maybe not pip's build tools): links laid out as setup.py maps the folders, first on the path. Every
# python runs with -P: the repository root (the cwd) must not come first, its pagedserve/ holds only
# __init__.py.
site=$(mktemp -d)
trap 'rm -rf "$site"' EXIT
mkdir "$site/pagedserve"
ln -s "$PWD/pagedserve/__init__.py" "$site/pagedserve/__init__.py"
for folder in services shared kernels ops; do ln -s "$PWD/$folder" "$site/pagedserve/$folder"; done
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
status=0
started=$(date +%s)

step() { echo; echo "== $* (t+$(( $(date +%s) - started ))s)"; }

step "device"
nvidia-smi --query-gpu=name,memory.total,clocks.max.memory --format=csv 2>&1 | tee "$results/device.txt"
"$py" -c 'import torch, triton; print("torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__)' \
  | tee -a "$results/device.txt"

step "1/3 kernel correctness + decode bandwidth (pagedserve.ops.gpu.check)"
timeout 240 "$py" -P -m pagedserve.ops.gpu.check --out "$results" 2>&1 | tee "$results/gpu_check.log"
rc=${PIPESTATUS[0]}; [ "$rc" -eq 0 ] || { echo "pagedserve.ops.gpu.check failed (exit $rc)"; status=1; }

step "2/3 Triton kernel unit tests, compiled"
if "$py" -c 'import pytest, hypothesis' 2>/dev/null; then
  # --noconftest: the suite-wide conftest imports test helpers this image cannot load.
  # Fewer examples than on the CPU: every new shape is a fresh compile.
  PAGEDSERVE_TRITON_EXAMPLES=${PAGEDSERVE_TRITON_EXAMPLES:-10} timeout 150 "$py" -P -m pytest -q -p no:cacheprovider \
    --noconftest -o addopts="" tests/unit/kernels/test_triton_write_kv.py tests/unit/kernels/test_triton_decode.py \
    tests/unit/kernels/test_triton_prefill.py tests/unit/kernels/test_triton_backend.py 2>&1 | tee "$results/pytest.log"
  rc=${PIPESTATUS[0]}; [ "$rc" -eq 0 ] || { echo "kernel tests failed (exit $rc)"; status=1; }
else
  echo "skipped: pytest or hypothesis not installed (step 1 covered correctness)" | tee "$results/pytest.log"
fi

step "3/3 pagedserve bench on the triton backend"
if command -v pagedserve >/dev/null 2>&1; then bench=(pagedserve bench); else bench=("$py" -P -m pagedserve.ops.cli bench); fi
if "${bench[@]}" --help 2>&1 | grep -q -- "--attention-backend"; then
  timeout 90 "${bench[@]}" --attention-backend triton --device cuda 2>&1 | tee "$results/bench.log"
  rc=${PIPESTATUS[0]}; [ "$rc" -eq 0 ] || { echo "pagedserve bench failed (exit $rc)"; status=1; }
  grep -i "tok" "$results/bench.log" | tail -5
else
  echo "skipped: '${bench[*]} --help' has no --attention-backend here:" | tee "$results/bench.log"
  "${bench[@]}" --help 2>&1 | tail -3 | tee -a "$results/bench.log"
fi

step "done, exit $status"
[ -n "${OUT:-}" ] && cp -r "$results" "$OUT/" 2>/dev/null
[ -f "$results/attention.md" ] && cat "$results/attention.md"
exit $status
