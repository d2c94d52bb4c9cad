#!/usr/bin/env bash
# Set up the virtual environments, idempotently (a stamp skips work already done).
#   bash scripts/setup.sh          .venv      : vlmfast + transformers 5.x (and torch, torchvision)
#   bash scripts/setup.sh --tf4    also .venv-tf4: transformers 4.57.x, reusing .venv's torch via a .pth
# Set PYTHON to choose the interpreter (default python3).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PY=${PYTHON:-python3}
quiet() { "$@" 2>&1 | grep -vE "is ignored: it is neither a file nor a directory|^\s*$" || true; }
stamp_of() { cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16; }
source scripts/need_disk.sh
source scripts/tree_lock.sh

if [ "$(cat .venv/.vlmfast-stamp 2>/dev/null)" != "$(stamp_of)" ]; then
  echo "[setup] creating .venv (torch + transformers 5.x; first time takes ~2 min)" >&2
  # torch's CUDA build alone is 5.5 GB installed; a torch already in .venv (a CPU build, say) stays
  if .venv/bin/python -c "import torch" 2>/dev/null; then need_disk 2 ".venv (transformers 5.x)"
  else need_disk 7 ".venv (torch, transformers 5.x)"; fi
  "$PY" -m venv .venv
  # One resolve for everything: pip picks torch/torchvision that match each other.
  one_at_a_time quiet .venv/bin/pip install -q -e ".[dev]"
  .venv/bin/python -c "import torch, torchvision, transformers, vlmfast" || { echo "[setup] .venv is broken" >&2; exit 1; }
  stamp_of > .venv/.vlmfast-stamp
fi

if [ "${1:-}" = "--tf4" ] && [ "$(cat .venv-tf4/.vlmfast-stamp 2>/dev/null)" != "$(stamp_of)" ]; then
  echo "[setup] creating .venv-tf4 (transformers 4.57.x, sharing .venv's torch)" >&2
  need_disk 1 ".venv-tf4 (transformers 4.57.x)"
  "$PY" -m venv .venv-tf4
  site4=$(.venv-tf4/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  site5=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  # Packages installed in .venv-tf4 come first on sys.path; anything missing falls through to .venv.
  echo "$site5" > "$site4/zz_vlmfast_shared_venv.pth"
  quiet .venv-tf4/bin/pip install -q "transformers>=4.57,<4.58"
  one_at_a_time quiet .venv-tf4/bin/pip install -q --no-deps -e .
  .venv-tf4/bin/python -c "import transformers, vlmfast; assert transformers.__version__.startswith('4.57'), transformers.__version__" \
    || { echo "[setup] .venv-tf4 is broken" >&2; exit 1; }
  stamp_of > .venv-tf4/.vlmfast-stamp
fi
