#!/usr/bin/env bash
# GPU figures in one command, on a machine with a CUDA device:
#   bash benchmarks/gpu.sh [CKPT]
# Without CKPT it builds random-weight checkpoints of the real Qwen2.5-VL-3B and -7B shapes (saved as
# GRPO trainers save them, cache off; tokenizer padded to the real vocabulary), so no model hub is needed.
# For each checkpoint: vlmfast bench at batch 1, 8 and 32 on 32 synthetic 448-px images × 128 forced
# tokens, in three modes — default (CUDA graphs), --compile, and --decoder hf (plain generate) — then the
# same compiled infer twice, to show what a second run spends compiling. The table goes into RESULTS.md.
# Knobs: SIZES="3b 7b", MODES="default compile hf", REPEATS=3, OUT_DIR=build/gpu-bench.
# Python: the machine's python3 when it already has vlmfast's dependencies (GPU images often do, and may
# have no registry to install from), otherwise .venv from scripts/setup.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
if python3 -c "import torch, transformers, accelerate, qwen_vl_utils, typer, rich, PIL" 2>/dev/null; then
  py=$(command -v python3)
  export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
else
  bash scripts/setup.sh
  py=$PWD/.venv/bin/python
fi
"$py" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device here'"
vlmfast() { "$py" -m vlmfast "$@"; }
out=${OUT_DIR:-build/gpu-bench}
mkdir -p "$out"
vlmfast make-images "$out/images" -n 32 --size 448 > /dev/null

if [ $# -ge 1 ]; then
  ckpts=("$1")
else
  ckpts=()
  for size in ${SIZES:-3b 7b}; do
    echo "[gpu.sh] building a random-weight Qwen2.5-VL-$size checkpoint" >&2
    ckpts+=("$(vlmfast make-checkpoint "$out/qwen2.5-vl-$size-grpo" --preset "$size" --like grpo)")
  done
fi

reports=()
for ckpt in "${ckpts[@]}"; do
  name=$(basename "$ckpt")
  common=(--ckpt "$ckpt" --images "$out/images" --max-new-tokens "${MAX_NEW_TOKENS:-128}" --ignore-eos
          --no-as-saved --warmup 1 --repeats "${REPEATS:-3}")
  for mode in ${MODES:-default compile hf}; do
    case $mode in
      default) extra=(--batch-sizes 1,8,32) ;;
      compile) extra=(--batch-sizes 1,8,32 --compile) ;;
      hf) extra=(--batch-sizes 1,32 --decoder hf) ;;
    esac
    echo "[gpu.sh] $name: bench $mode" >&2
    vlmfast bench "${common[@]}" "${extra[@]}" --report "$out/$name-$mode" > /dev/null
    reports+=("$name/$mode=$out/$name-$mode")
  done
  for run in first second; do  # the second run finds the compiled kernels in the cache
    vlmfast infer --ckpt "$ckpt" --images "$out/images" --prompt "Describe this image." --max-new-tokens 128 \
      --ignore-eos --batch-size 32 --compile --out "$out/$name-$run.jsonl" --overwrite --json > "$out/$name-infer-$run.json"
  done
  reports+=("$name/infer=$out/$name-infer-first.json,$out/$name-infer-second.json")
done
"$py" benchmarks/gpu_table.py "${reports[@]}" --write
