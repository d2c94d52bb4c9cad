#!/usr/bin/env bash
# Set up .venv and run the offline demo (a GRPO-like tiny checkpoint, 8 images, infer + report).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/vlmfast demo "$@"
