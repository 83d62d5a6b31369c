#!/usr/bin/env bash
# GPU smoke check, for a box with one CUDA GPU and torch/transformers/peft/accelerate
# already installed (e.g. a lent H200 where trl and deepspeed travel as wheels):
#   1. tiny locator SFT, a few steps, bf16 on CUDA
#   2. GRPO, a few steps, bf16 on CUDA (transformers generation; no vLLM needed)
#   3. one SFT step under DeepSpeed ZeRO-2 through accelerate (skipped without deepspeed)
# Prints one "SMOKE <step>: ok|FAILED|skipped" line per step and exits non-zero on a failure.
# Usage: PYTHONPATH=src bash scripts/gpu_smoke.sh [OUT_DIR]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/gpu-smoke}
PY=${PYTHON:-python3}
export HF_HUB_OFFLINE=1 WANDB_MODE=disabled TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
export PYTHONPATH="${PYTHONPATH:-}:src"
mkdir -p "$OUT"
# TIDER_SMOKE_ALLOW_CPU=1 runs the same steps on a CPU box (to check the script itself).
if [ -n "${TIDER_SMOKE_ALLOW_CPU:-}" ]; then USE_CPU=true; else
  "$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print('cuda', torch.version.cuda, torch.cuda.get_device_name(0))" || exit 2
fi

common=(--use_cpu "${USE_CPU:-false}" --bf16 true --report_to none --save_strategy no --tiny_num_layers 2)
status=0
step() {  # name, then the command
  local name=$1; shift
  local t0=$SECONDS
  if "$@" >"$OUT/$name.log" 2>&1; then echo "SMOKE $name: ok ($((SECONDS - t0)) s)"
  else echo "SMOKE $name: FAILED ($((SECONDS - t0)) s), tail of $OUT/$name.log:"; tail -20 "$OUT/$name.log"; status=1; fi
}
step sft "$PY" -m tider.cli sft --config configs/sft/tiny-cpu.yaml "${common[@]}" \
  --model_name_or_path "$OUT/base" --output_dir "$OUT/sft" --max_steps 10
step grpo "$PY" -m tider.cli grpo --config configs/grpo/tiny-cpu.yaml "${common[@]}" \
  --model_name_or_path "$OUT/sft" --output_dir "$OUT/grpo" --max_steps 3 --use_vllm false
if "$PY" -c "import deepspeed" 2>/dev/null; then
  step zero2 accelerate launch --config_file configs/accelerate/zero2.yaml --num_processes 1 \
    -m tider.cli sft --config configs/sft/tiny-cpu.yaml "${common[@]}" \
    --model_name_or_path "$OUT/base" --output_dir "$OUT/zero2" --max_steps 1
else
  echo "SMOKE zero2: skipped (deepspeed not importable)"
fi
exit $status
