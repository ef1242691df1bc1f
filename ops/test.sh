#!/usr/bin/env bash
# Install dimple with its test extras into .venv (ops/install.sh) and run the tests.
#   bash ops/test.sh              default tier (not slow), on two xdist workers
#   bash ops/test.sh tests [OPTIONS]   everything, slow tier included, on two xdist workers (what CI runs)
#   bash ops/test.sh tests/unit -k fuse    any other pytest arguments, as given (one process)
# Two workers, --dist loadgroup: tests sharing the worker stack or the LoCoMo store
# run on one worker, which builds it once (tests/conftest.py). A worker that
# crashes is not replaced: pytest-xdist 3.8's loadgroup scheduler hangs until
# killed after replacing one (pytest-xdist#1323, #1378), and the test it died
# in is reported failed either way.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ops/install.sh test   # .venv, the CPU torch wheel where it can, dimple with its test extras
if ! command -v redis-server >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "redis-server not found: installing Debian's redis-server package"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
  else
    echo "The integration tests need redis-server on PATH: 'sudo apt-get install redis-server' (Debian/Ubuntu) or 'brew install redis' (macOS)."
    exit 1
  fi
fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
XDIST=(-n 2 --dist loadgroup --max-worker-restart=0)
if [ $# -eq 0 ]; then
  set -- -m "not slow" "${XDIST[@]}"
elif [ "$1" = tests ]; then
  set -- "$@" "${XDIST[@]}"
fi
exec .venv/bin/python -m pytest "$@"
