#!/usr/bin/env bash
# Set up (idempotent) and run the whole test suite, the slow and vLLM-marked tests included.
# Fast subset while developing: scripts/test.sh -m "not slow and not vllm"
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/setup_vllm.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_MODE=disabled TOKENIZERS_PARALLELISM=false
exec .venv/bin/python -m pytest "$@"
