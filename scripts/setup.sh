#!/usr/bin/env bash
# Create .venv and install tider with pinned versions.
#   CPU box (default): torch==2.13.0 CPU wheel first, then everything under constraints.txt.
#   GPU box: TIDER_TORCH_INDEX=https://download.pytorch.org/whl/cu128 (or your CUDA build)
#            and TIDER_EXTRAS=dev,gpu for DeepSpeed.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${TIDER_VENV:-.venv}
PY=${PYTHON:-python3}
EXTRAS=${TIDER_EXTRAS:-dev}
stamp="$VENV/.tider-installed"
want="$(cat pyproject.toml constraints.txt | sha1sum | cut -c1-12)-$EXTRAS"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0  # already installed with these pins
fi
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/pip" install -q -U pip
if [ -n "${TIDER_TORCH_INDEX:-}" ]; then
  "$VENV/bin/pip" install -q torch==2.13.0 --index-url "$TIDER_TORCH_INDEX"
else
  "$VENV/bin/pip" install -q torch==2.13.0
fi
[ "${EXTRAS#*gpu}" != "$EXTRAS" ] && export DS_BUILD_OPS=0
"$VENV/bin/pip" install -q -c constraints.txt -e ".[$EXTRAS]"
echo "$want" > "$stamp"
