#!/usr/bin/env bash
# Set up (idempotent) and run the whole test suite: slow, vLLM, recipe and 2-process tests included.
# Fast subset while developing: scripts/test.sh -m "not slow and not vllm"
# Every shipped recipe for 1-2 steps: scripts/test.sh -m recipe
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_MODE=disabled TOKENIZERS_PARALLELISM=false VLLM_CPU_KVCACHE_SPACE=1
exec .venv/bin/python -m pytest "$@"
