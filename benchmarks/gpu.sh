#!/usr/bin/env bash
# Issue #6 on a GPU machine, one command:
#   bash benchmarks/gpu.sh CKPT [BASE]
# CKPT: a real Qwen2.5-VL checkpoint (e.g. a GRPO run of Qwen2.5-VL-3B-Instruct, or the base itself).
# Runs vlmfast bench eager and with --compile at batch 1, 8 and 32 (bf16, flash-attn when installed),
# (flash-attn only from a prebuilt wheel: a source build takes hours), then writes the table (tokens/s, TTFT, decode ms/token, GB/s, % of peak bandwidth) into RESULTS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { echo "usage: $0 CKPT [BASE]" >&2; exit 2; }
ckpt=$1
base=${2:-}
bash scripts/setup.sh
.venv/bin/python -c "import torch; assert torch.cuda.is_available(), 'no CUDA device here'"
.venv/bin/pip install -q --only-binary=:all: flash-attn 2>/dev/null || echo "[gpu.sh] flash-attn not installed: sdpa (vlmfast says so)" >&2
out=${OUT_DIR:-build/gpu-bench}
common=(--ckpt "$ckpt" --synthetic "${SYNTHETIC:-32}" --synthetic-size 448 --max-new-tokens "${MAX_NEW_TOKENS:-128}"
        --ignore-eos --batch-sizes 1,8,32 --no-as-saved --warmup 1 --repeats "${REPEATS:-3}")
[ -n "$base" ] && common+=(--compare-base "$base")
.venv/bin/vlmfast bench "${common[@]}" --report "$out/eager" > /dev/null
.venv/bin/vlmfast bench "${common[@]}" --compile --report "$out/compile" > /dev/null
cd benchmarks && ../.venv/bin/python gpu_table.py eager="../$out/eager" compile="../$out/compile" --write
