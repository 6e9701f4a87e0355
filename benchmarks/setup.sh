#!/usr/bin/env bash
# Peer environment for the benchmarks: ckptview plus the frameworks it is compared against
# (torch's own loader, safetensors), kept apart from the project's venv so the core's
# no-framework rule is untouched. Usage: bash benchmarks/setup.sh
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="$here/.venv"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/pip" install -q --upgrade pip
"$venv/bin/pip" install -q "torch==2.13.0" safetensors psutil numpy gguf
"$venv/bin/pip" install -q -e "$here/.."
echo "peer environment ready: $venv"
