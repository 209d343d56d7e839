#!/usr/bin/env bash
# Optional: a venv with the client frameworks ops/clients/drive.py runs against our API (never the
# project's venv, never CI): the OpenAI Agents SDK and LangChain's ChatOpenAI. Safe to run again.
#
# Usage: ops/clients/setup.sh [VENV]   (default: .venv-clients at the repo root)
set -euo pipefail
cd "$(dirname "$0")/../.."
venv=${1:-.venv-clients}
py=${PYTHON:-python3}
[ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
"$venv/bin/pip" install -q "openai-agents==0.24.0" "langchain-openai==1.8.1"
echo "clients venv ready: $venv"
