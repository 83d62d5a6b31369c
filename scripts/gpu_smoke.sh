#!/usr/bin/env bash
# A rehearsal of the production path (README "Train, export, serve and evaluate on a GPU
# cluster") on one GPU, offline, at Qwen3-1.7B's shapes with random weights, in ~8 minutes:
#   data     a small synthetic benchmark (tider data synth)
#   embedder a random-init sentence-transformer built on the data (tider.train.tiny), named by
#            OUT/retrieval.yaml for training and compare: the all-MiniLM-L6-v2 package (83 MB)
#            cannot travel to a lent GPU box, and this checks the pipeline, not retrieval quality
#   base     a random-init Qwen3 at Qwen3-1.7B's shapes around the shipped tokenizer
#   reader   a vLLM server of the shipped tiny locator (models/tiny-locator-v3): the reader
#            answer_correct asks, started before SFT so that both load at once. A stand-in for
#            the recipes' Qwen3-8B; a random-init model writes nothing decodable and fails
#            the reader probe GRPO starts with.
#   sft      configs/sft/qwen3-1.7b.yaml, a few steps
#   grpo     configs/grpo/qwen3-1.7b.yaml, a few steps, vLLM colocated, answer_correct via the reader
#   export   tider export: verified, atomic, on the GPU
#   serve    tider serve of the export (vLLM)
#   compare  tider eval compare, the served export against none/rules, on a slice of held-out questions
# vLLM is required: without it (it is too large to carry to a lent GPU box, so the image must
# have it) the preflight row fails naming it and the script stops with status 1, before any
# training. Every step's log is OUT/<step>.log; one table (step | status | seconds | figure)
# is printed and written to OUT/summary.md; a FAILED or skipped row makes the exit status 1:
# a rehearsal that did not run a step did not pass it.
#
# TIDER_SMOKE_ALLOW_CPU=1: the same steps at tiny size on CPU, float32 (tests/test_gpu_smoke.py).
# Wheels the GPU image lacks travel in .whl/ (scripts/gpu_wheels.sh); they are installed to /tmp/site.
# Usage: bash scripts/gpu_smoke.sh [OUT_DIR]    (PYTHON=... picks the interpreter;
#        TIDER_SMOKE_SFT_STEPS / TIDER_SMOKE_GRPO_STEPS / TIDER_SMOKE_LIMIT size the run)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/gpu-smoke}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
# A rerun starts over (TRL would resume from an earlier run's output folders).
rm -rf "$OUT"/{data,embedder,base,sft,grpo,export,compare} "$OUT"/.*.ok "$OUT"/*.ready
if [ -n "${PYTHON:-}" ]; then PY=$PYTHON; elif [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_MODE=disabled TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
export VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
TIDER=("$PY" -m tider.cli)

if [ -n "${TIDER_SMOKE_ALLOW_CPU:-}" ]; then
  WHERE=cpu SFT_STEPS=${TIDER_SMOKE_SFT_STEPS:-2} GRPO_STEPS=${TIDER_SMOKE_GRPO_STEPS:-1}
  LIMIT=${TIDER_SMOKE_LIMIT:-12} DTYPE=float32
  # Test-size shapes (the rest is Qwen3-1.7B's); a vocabulary larger than the tokenizer's, as Qwen3's.
  SHAPES='{"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2, '
  SHAPES+='"num_key_value_heads": 1, "head_dim": 32, "vocab_size": 6144}'
  # float32 (a CPU without native bf16 emulates it, ~100x slower) and CPU-sized batches.
  SFT_SIZE=(--use_cpu true --dtype float32 --bf16 false --gradient_accumulation_steps 1 --per_device_train_batch_size 2)
  GRPO_SIZE=(--use_cpu true --dtype float32 --bf16 false --gradient_accumulation_steps 1
             --per_device_train_batch_size 8 --num_generations 8 --max_completion_length 64
             --answer_samples 1)  # greedy: vllm-cpu 0.31 dies on seeded samples whose prefill is chunked
  READER_FLAGS=(--dtype float32 --enforce-eager --max-num-seqs 8)
  SERVE_FLAGS=(--enforce-eager --dtype float32)  # vLLM's CPU `auto` downcasts float32 to bf16
else
  if [ -d .whl ] && compgen -G ".whl/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 2
    export PYTHONPATH="$PYTHONPATH:/tmp/site"
  fi
  "$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device (TIDER_SMOKE_ALLOW_CPU=1 for the CPU form)'" || exit 2
  WHERE=cuda SFT_STEPS=${TIDER_SMOKE_SFT_STEPS:-8} GRPO_STEPS=${TIDER_SMOKE_GRPO_STEPS:-3}
  LIMIT=${TIDER_SMOKE_LIMIT:-40} DTYPE=bfloat16 SHAPES='{}'
  SFT_SIZE=() GRPO_SIZE=()
  # The reader shares the GPU with training and its colocated vLLM (the recipe's 0.3).
  READER_FLAGS=(--dtype bfloat16 --gpu-memory-utilization 0.1)
  SERVE_FLAGS=()
fi
VLLM=$("$PY" -c "import vllm; print(vllm.__version__)" 2>/dev/null | tail -1)

# A locator-shaped JSON (dates inside the synthetic data's 2023-01..03) for vLLM's structured
# output: a random-init model never writes parseable JSON, and every reward, the reader's
# included, would score it 0 without reading it.
LOCATOR_JSON='\{"temporal": (false, "windows": \[\]|true, "windows": \[\{"start": "2023-0[1-3]-(0[1-9]|1[0-9]|2[0-8])", "end": "2023-0[1-3]-(0[1-9]|1[0-9]|2[0-8])"\}\])\}'
DATA=(--dataset_name synthetic --dataset_path "$OUT/data" --validation_memories "" --test_memories ""
  --retrieval_config "$OUT/retrieval.yaml")
COMMON=(--report_to none --logging_steps 1 --save_strategy no --eval_strategy no --seed 0)

ROWS=() STATUS=0 PIDS=()
row() {  # STEP STATUS SECONDS FIGURE
  ROWS+=("| $1 | $2 | $3 | $4 |")
  [ "$2" = ok ] || STATUS=1
  echo "SMOKE $1: $2 ($3 s) $4"
}
run_step() {  # STEP NEEDS FIGURE-FUNCTION CMD...: CMD logs to OUT/STEP.log; NEEDS: steps that must be ok ('-': none)
  local name=$1 needs=$2 figure=$3 t0=$SECONDS need
  shift 3
  for need in ${needs//,/ }; do
    [ "$need" = - ] || [ -e "$OUT/.$need.ok" ] || { row "$name" skipped 0 "($need did not run)"; return; }
  done
  if "$@" >"$OUT/$name.log" 2>&1; then
    touch "$OUT/.$name.ok"
    row "$name" ok $((SECONDS - t0)) "$($figure 2>>"$OUT/$name.log")"
  else
    row "$name" FAILED $((SECONDS - t0)) "see $name.log"
    tail -25 "$OUT/$name.log"
  fi
}
py() { "$PY" -c "$@"; }
cleanup() {  # SIGTERM our servers (they stop vLLM's process group), and wait for them
  local pid
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null; done
  PIDS=()
}
trap cleanup EXIT
trap 'exit 143' TERM INT  # through the EXIT trap: no server outlives the smoke

free_port() { py "from tider.llm.vllm_server import free_port; print(free_port())"; }

# ------------------------------------------------------------------ figures (one line each)
fig_embedder() { py "
import json; c = json.load(open('$OUT/embedder/bert/config.json'))
print(f\"random-init sentence-transformer: {c['num_hidden_layers']} layers x {c['hidden_size']}, vocab {c['vocab_size']}\")"; }
fig_data() { py "
m, q = (sum(1 for _ in open(f'$OUT/data/{n}.jsonl')) for n in ('messages', 'queries'))
print(f'{m} messages, {q} questions')"; }
fig_base() { py "
import glob, json, math; from safetensors import safe_open; c = json.load(open('$OUT/base/config.json')); n = 0
for f in glob.glob('$OUT/base/*.safetensors'):
    with safe_open(f, 'pt') as s: n += sum(math.prod(s.get_slice(k).get_shape()) for k in s.keys())
print(f\"{n / 1e6:,.1f}M params: {c['num_hidden_layers']} layers x {c['hidden_size']}, vocab {c['vocab_size']}, {c['dtype']}\")"; }
fig_sft() { py "
import json; h = [x for x in json.load(open('$OUT/sft/trainer_state.json'))['log_history'] if 'loss' in x]
print(f\"loss {h[0]['loss']:.3f} -> {h[-1]['loss']:.3f} ({h[-1]['step']} steps)\")"; }
fig_grpo() { py "
import json; h = [x for x in json.load(open('$OUT/grpo/trainer_state.json'))['log_history'] if 'reward' in x]
ac = [x['rewards/answer_correct/mean'] for x in h if 'rewards/answer_correct/mean' in x]
calls, fails = (sum(x.get(k, 0) for x in h) for k in ('reader/calls', 'reader/failures'))
reader = f', answer_correct {sum(ac) / len(ac):.3f} ({calls:.0f} reader calls, {fails:.0f} failed)' if ac else ''
n = h[-1]['step']; print(f\"reward {sum(x['reward'] for x in h) / len(h):.3f} over {n} step{'s' * (n != 1)}{reader}\")"; }
fig_reader() { echo "vLLM serving models/tiny-locator-v3 as 'reader'"; }
fig_export() { py "
import json; r = json.load(open('$OUT/export/export_report.json'))
print(f\"greedy identical {r['greedy_identical']}, max logit diff {r['max_abs_logit_diff']:.2g}, {r['dtype']} on {r['device']}\")"; }
fig_serve() { echo "vLLM serving the export as 'tider-locator'"; }
fig_compare() { py "
import json; t = json.load(open('$OUT/compare/compare.json'))['table']
r = ', '.join(f\"{m} {t[m]['recall@5']:.3f}/{t[m]['recall@20']:.3f}\" for m in t)
print(f\"recall@5/@20 {r}; locator parse_fail {t['locator']['parse_fail']:.2f} (n {t['locator']['n']})\")"; }
compare() {  # tider eval compare ARGS..., then: every locator request was answered (a parse failure is the model's)
  "${TIDER[@]}" eval compare "$@" || return 1
  py "
import collections, json
records = [json.loads(line)['record'] for line in open('$OUT/compare/retrieval/retrieve-locator.jsonl')]
failures = collections.Counter(r.get('parse_failure') for r in records)
print(f'locator answers: {len(records)}, failures by kind: {dict(failures)}')
assert records and not failures['request_failed'], 'the locator requests failed (see the server log)'"
}
# What tider imports at run time beyond torch/transformers/peft/accelerate (scripts/gpu_wheels.sh carries
# them; the GPU image has sentence-transformers, and the embedder step builds the model).
fig_preflight() { py "
import sys, torch, transformers; d = torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'CPU'
print(f'{d}: python {sys.version.split()[0]}, torch {torch.__version__}, transformers {transformers.__version__}', end='')"
  echo ", vllm ${VLLM:-not importable}"; }
preflight() {
  local missing
  missing=$("$PY" -c "
import importlib.util as u
names = ['trl', 'datasets', 'peft', 'accelerate', 'bm25s', 'Stemmer', 'openai', 'jsonschema', 'ms_recognizers_date_time',
         'sentence_transformers']
print(' '.join(n for n in names if u.find_spec(n) is None))")
  [ -n "$VLLM" ] || missing+=" vllm (the reader, GRPO's rollouts and serving need it: install it in the image)"
  [ -z "${missing# }" ] || { echo "not importable: ${missing# }"; return 1; }
}
table() {
  {
    echo "| step | status | s | figure |"
    echo "|---|---|---|---|"
    printf '%s\n' "${ROWS[@]}"
  } | tee "$OUT/summary.md"
}

# ------------------------------------------------------------------ servers
# The reader: VLLMServer (tider.llm.vllm_server) held until SIGTERM, with the flags a shared
# GPU needs (tider serve is for locator exports and sets no memory share). The `reader` row
# waits for it after SFT.
start_reader() {  # PORT
  "$PY" - models/tiny-locator-v3 "$1" "$OUT/reader-vllm.log" "$OUT/reader.ready" "${READER_FLAGS[@]}" \
    >"$OUT/reader-server.log" 2>&1 <<'EOF' &
import signal, sys
from pathlib import Path
from tider.llm.vllm_server import VLLMServer
model, port, log, ready, *flags = sys.argv[1:]
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # SystemExit: leaving the with-block stops vLLM
with VLLMServer(model, port=int(port), served_model_name="reader", max_model_len=4096, extra_args=flags,
                log_path=log, startup_timeout=900) as server:
    Path(ready).write_text(server.base_url)
    while True:
        signal.pause()
EOF
  READER_PID=$!
  PIDS+=("$READER_PID")
}
reader_ready() {  # until the reader answers; fails with its log if it exits first
  until [ -s "$OUT/reader.ready" ]; do
    kill -0 "$READER_PID" 2>/dev/null || { tail -40 "$OUT/reader-server.log"; return 1; }
    sleep 1
  done
}
serve_export() {  # PORT: tider serve in the background (stdout: this step's log), until it answers
  "${TIDER[@]}" serve --model "$OUT/export" --port "$1" --log "$OUT/serve-vllm.log" --startup-timeout 900 \
    "${SERVE_FLAGS[@]}" &
  PIDS+=("$!")
  until grep -q "^serving " "$OUT/serve.log" 2>/dev/null; do
    kill -0 "$!" 2>/dev/null || return 1
    sleep 1
  done
}

# ------------------------------------------------------------------ the steps
echo "gpu_smoke on $WHERE, out $OUT"
run_step preflight - fig_preflight preflight
[ -e "$OUT/.preflight.ok" ] || { table; exit 1; }  # nothing else can pass: stop before any training
run_step data - fig_data "${TIDER[@]}" data synth --out "$OUT/data" --messages 600 --conversations 3 --seed 0
run_step embedder data fig_embedder py "
import json; from tider.train.tiny import build_tiny_embedder
texts = [json.loads(line)['text'] for line in open('$OUT/data/messages.jsonl')]
build_tiny_embedder('$OUT/embedder', texts)
open('$OUT/retrieval.yaml', 'w').write('embedding_model: $OUT/embedder\n')"
run_step base - fig_base py "
import json; from tider.train.tiny import build_qwen3_from_shapes
build_qwen3_from_shapes('$OUT/base', 'models/tiny-locator-v3', json.loads('$SHAPES'), dtype='$DTYPE', device='$WHERE')"
start_reader "$(free_port)"
run_step sft data,embedder,base fig_sft "${TIDER[@]}" sft --config configs/sft/qwen3-1.7b.yaml --model_name_or_path "$OUT/base" \
  --output_dir "$OUT/sft" --max_steps "$SFT_STEPS" "${DATA[@]}" "${COMMON[@]}" "${SFT_SIZE[@]}"
run_step reader - fig_reader reader_ready
run_step grpo sft,reader fig_grpo "${TIDER[@]}" grpo --config configs/grpo/qwen3-1.7b.yaml \
  --model_name_or_path "$OUT/sft" --output_dir "$OUT/grpo" --max_steps "$GRPO_STEPS" \
  --reader_base_url "$(cat "$OUT/reader.ready" 2>/dev/null)" --reader_model reader \
  --vllm_structured_outputs_regex "$LOCATOR_JSON" "${DATA[@]}" "${COMMON[@]}" "${GRPO_SIZE[@]}"
cleanup  # the reader's GPU share goes back before the export is served
run_step export grpo fig_export "${TIDER[@]}" export --checkpoint "$OUT/grpo" --out "$OUT/export" \
  --dtype "$DTYPE" --overwrite
COMPARE=(--dataset synthetic --path "$OUT/data" --config "$OUT/retrieval.yaml" --split heldout --limit "$LIMIT"
  --baselines none,rules --out "$OUT/compare" --overwrite)
SERVE_PORT=$(free_port)
run_step serve export fig_serve serve_export "$SERVE_PORT"
run_step compare serve fig_compare compare "${COMPARE[@]}" --locator-url "http://127.0.0.1:$SERVE_PORT/v1" \
  --locator-model tider-locator --locator-meta "$OUT/export"
cleanup

table
exit $STATUS
