#!/usr/bin/env bash
# A rehearsal of the production path on one GPU, offline, at Qwen3-1.7B's shapes with random
# weights, in ~8 minutes: data, a random-init embedder and base model, SFT and GRPO with the
# production recipes (a vLLM reader that answer_correct asks, vLLM colocated), the export,
# tider serve of it and tider eval compare against it. The steps are tider.pipeline's stages,
# run by scripts/gpu_smoke.py (its docstring lists them); this script sets up the environment.
# Every step's log is OUT/<step>.log; one table (step | status | seconds | figure) is printed
# and written to OUT/summary.md; a FAILED or skipped row makes the exit status 1.
#
# TIDER_SMOKE_ALLOW_CPU=1: the same steps at tiny size on CPU, float32 (tests/test_gpu_smoke.py).
# Wheels the GPU image lacks travel in .whl/ (scripts/gpu_wheels.sh); they are installed to /tmp/site.
# Usage: bash scripts/gpu_smoke.sh [OUT_DIR]    (PYTHON=... picks the interpreter;
#        TIDER_SMOKE_SFT_STEPS / TIDER_SMOKE_GRPO_STEPS / TIDER_SMOKE_LIMIT size the run)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/gpu-smoke}
if [ -n "${PYTHON:-}" ]; then PY=$PYTHON; elif [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_MODE=disabled TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
export VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
if [ -z "${TIDER_SMOKE_ALLOW_CPU:-}" ]; then
  if [ -d .whl ] && compgen -G ".whl/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 2
    export PYTHONPATH="$PYTHONPATH:/tmp/site"
  fi
  "$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device (TIDER_SMOKE_ALLOW_CPU=1 for the CPU form)'" || exit 2
fi
exec "$PY" scripts/gpu_smoke.py "$OUT"
