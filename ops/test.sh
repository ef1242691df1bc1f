#!/usr/bin/env bash
# Install dimple with its test extras into .venv (ops/install.sh) and run the tests.
#   bash ops/test.sh              default tier (not slow)
#   bash ops/test.sh tests        everything, slow tier included (what CI runs)
#   bash ops/test.sh -k fuse      any pytest arguments
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
if [ $# -eq 0 ]; then
  set -- -m "not slow"
fi
exec .venv/bin/python -m pytest "$@"
