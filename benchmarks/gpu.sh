#!/usr/bin/env bash
# GPU figures on a CUDA machine, as a list of steps that each take under 8 minutes, without a package index:
#   bash benchmarks/gpu.sh [CKPT]          run the steps not done yet, as many as fit SLICE_S; rerun until exit 0
#   DRY_RUN=1 bash benchmarks/gpu.sh       print the plan: each step, its estimate and limit, run or skip (no GPU needed)
# Exit codes: 0 every step done, table written · 75 steps left: run the same command again · 1 a step
# failed or ran past its limit · 2 the machine lacks CUDA or a Python package (named) that WHEELS could not
# provide · 143 (130) stopped by SIGTERM (SIGINT): the running step's processes killed, results copied.
#
# A lease of one call (a command killed at 600 s): KEEP_GOING=1 SLICE_S=420 timeout 570 bash benchmarks/gpu.sh.
# SLICE_S counts from the script's start, setup included: a step starts only if its estimate ends by 420 s,
# which leaves 150 s of the 570 to steps that overrun their estimates. At 570 s `timeout` sends SIGTERM: the
# script kills the running step's process tree and copies what it has, 30 s before the call is killed.
# A lease of 900 s (2026-11-28, an H100): call 1 `KEEP_GOING=1 SLICE_S=420 timeout 555 bash benchmarks/gpu.sh`
# ran cuda-tests to default-b1 in 399 s (the machine's start and the wheels besides: 428 s of the lease); call 2,
# at once while the machine was warm, `ONLY='kernels|decode-attention|prefill|lengths' ... SLICE_S=330 timeout 395`
# ran the rest in 231 s. The two timeouts add to more than the lease: size call 2's from what the device
# tool's `status` says is left (budget_left_s − 30 s for the copy back; SLICE_S = that − 65), else the lease
# ends call 2 before its own `timeout` lets the script copy the step in flight. Each step took: cuda-tests 84 s of tests, build ~40, default-b32 37, compile-b1 87, its
# SDPA twin 87, default-b1 50, kernels 43, decode-attention 30, prefill-compiled 34, lengths 122.
# Every step has its own limit, 2 × its estimate + 60 s (STEP_LIMIT_S=N: N s for every step): past it, the
# step's process tree is killed, the step fails and the next one starts (KEEP_GOING=1).
#
# Where $OUT is set (the folder a lent machine's tool brings back: at most 8 files, 2 folders down), the
# small results are copied into $OUT/gpu-bench/ after every step and on exit, as at most 4 files:
# reports.tar.gz (reports/: its .json, .txt, .log and .part files under 5 MB, no compile cache or
# checkpoint), device.json, table.md and (WRITE_RESULTS=1) RESULTS.md.
#
# PLAN=one (the default): the Qwen2.5-VL-3B shape, its steps in the order of what a slice cut short should
# have measured first: tests/test_cuda.py, the checkpoint, batch 32 by default (CUDA graphs; 32 images: TTFT
# of 32 × 448 px, 32 × 128 tokens/s: two of issue 35's targets in ~50 s), the decode step at batch 1
# compiled (8 images, `--compile`: on CUDA the attention by two matrix products, the default) and compiled
# with SDPA's attention (VLMFAST_DECODE_ATTENTION=sdpa), batch 1 by default, the compiled step's kernels per
# layer (benchmarks/bench_kernels.py), the decode attention's candidates alone
# (benchmarks/bench_decode_attention.py), the prefill with the vision blocks compiled
# (benchmarks/profile_prefill.py), last the real-length mix — ~12.5 min by the estimates below (which ran
# ~30 % high in 0.12): one call runs what fits, the same command again the rest. PLAN=full adds the 7B
# shape, --compile and plain generate at batches 1, 8 and 32, a compiled `infer` twice, the vision tower
# and the eager prefill's profile: several calls.
#
# Without CKPT it builds random-weight checkpoints of the real Qwen2.5-VL-3B and -7B shapes (saved as
# GRPO trainers save them, cache off), so no model hub is needed. Per checkpoint: `vlmfast bench` in three
# modes — default (CUDA graphs), --compile, --decoder hf (plain generate) — then a compiled `infer` twice
# (the second finds the kernels in the compile cache), the real-length mix (bench_lengths.py) and the
# compiled step's kernels per layer (bench_kernels.py). First, once: the vision tower's attention per
# window vs merged (benchmarks/bench_vision.py); last, once: tests/test_cuda.py (pytest, from WHEELS if
# missing). A step whose report is in OUT_DIR is skipped, so a killed or timed-out slice loses only its
# running step. After every step one table is rebuilt from every report in OUT_DIR (OUT_DIR/table.md and
# the GPU section of benchmarks/RESULTS.md).
#
# With RUN_SIZE=7b (or 3b), last, a whole run judged end to end (the step run-SIZE-xN): RUN_CKPTS=20
# checkpoints of that shape (each its own seeded weights, ~17 GB of disk apiece for 7B: the step says how
# many fit), one `vlmfast sweep` over RUN_PROMPTS=500 images × RUN_TOKENS=512 forced tokens; its wall
# time, sustained tokens/s and swap seconds go into the table. At the defaults it needs a machine held
# for over an hour with 340 GB of disk, not a 10-minute slice: shrink the knobs to fit the machine.
#
# Knobs: PLAN=one|full, SIZES="3b 7b" (full), MODES="default compile hf" (full), ONLY=REGEX (run only the
# steps whose name matches, e.g. ONLY='build|default' to leave the vision step for later), KEEP_GOING=1 (a failed
# step does not stop the ones after it: for a one-call lease), OUT_DIR=build/gpu-bench, SLICE_S=420 (seconds
# from the start by which the steps started must end, by their estimates), STEP_LIMIT_S (every step's limit;
# by default its own), WRITE_RESULTS=1 (0: the table only in OUT_DIR),
# PYTHON=python3, WHEELS=DIR (missing packages are installed from there with `pip install --no-index
# --find-links DIR`, qwen-vl-utils without its video dependencies; fill it where an index is reachable,
# for the GPU machine's Python version and platform: `pip download --no-deps qwen-vl-utils -d DIR`).
# Before installing, the script says what it will install from where, and refuses a folder whose compiled
# wheels are for another Python version.
#
# How the steps are sized. PLAN=one, from the one H200 run of the 3B shape (vlmfast 0.6, torch 2.11,
# transformers 5.24: 4.82 ms per step at batch 1, 5.84 at 32, a TTFT of 0.42 s for 32 images, 26 s to
# compile and capture; the checkpoint is made on the GPU in bf16): build ≈ 30 s; batch 1 = 4,096
# token-steps ≈ 20 s + load + graph capture ≈ 50 s; batch 32 = 4 × (0.42 + 128 × 5.84 ms) ≈ 5 s + load
# + capture ≈ 50 s; kernels = two compiles ≈ 60 s; the mix = 6 runs of ~2,600 steps ≈ 140 s; the
# prefill profile ≈ 30 s, compiled ≈ 45 s; the decode attention's candidates ≈ 40 s; the CUDA tests ≈
# 180 s (33 tests; 30 took 84 s on an H100 in 0.18.3; 0.12's whole plan took 374 s against 530 s of its
# estimates): a step over its estimate only moves the rest to the next invocation. PLAN=full keeps the
# older, generous sizes (torch 2.11, transformers 5.17, vlmfast 0.1 on an H100): plain generate takes
# ~42 ms per token at batch 1 (48 ms on 7B: 13 min for 16,384 token-steps), and vlmfast's eager loop was
# no faster (39.9 ms) — assumed for CUDA graphs too. So batch 1 runs on the first 8 of the 32 images:
# 4,096 token-steps, ≤ 200 s at 48 ms. Batches 8 and 32 run all 32 images: 4 and 1 batches of 128 steps
# per run, ≤ 92 ms per step (349 tokens/s at batch 32). A compile costs 34–42 s per batch shape; loading a
# 7B checkpoint is allowed 90 s. Each estimate below rounds that up.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT_DIR:-build/gpu-bench}
dry=${DRY_RUN:-0}
[ "${1:-}" = "--dry-run" ] && { dry=1; shift; }
py=${PYTHON:-python3}
say() { echo "[gpu.sh] $*" >&2; }
die() { say "$1"; exit "${2:-1}"; }

# -- Python: the machine's own, with vlmfast from this tree; missing packages from WHEELS -------------
missing_packages() {
  "$py" - <<'PY'
import importlib.util
need = {"torch": "torch", "torchvision": "torchvision", "transformers": "transformers>=4.57,<6",
        "accelerate": "accelerate", "qwen_vl_utils": "qwen-vl-utils", "typer": "typer", "rich": "rich", "PIL": "pillow",
        "pytest": "pytest"}
print(" ".join(pkg for mod, pkg in need.items() if importlib.util.find_spec(mod) is None))
PY
}
wheels_fit() {  # the wheel folder holds compiled wheels for this Python, or none compiled at all
  local tag tags
  tag=$("$py" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")') || die "$py cannot run" 2
  [ -d "$WHEELS" ] || die "WHEELS=$WHEELS is not a folder here (did the call carry it?)" 2
  # an abi3 wheel (cp39-abi3: tokenizers, safetensors, hf-xet) fits every CPython from its tag on
  tags=$(find "$WHEELS" -maxdepth 1 -name '*.whl' ! -name '*-abi3-*' | { grep -oE -- '-cp[0-9]+-' || true; } | tr -d - | sort -u | tr '\n' ' ')
  [ -z "$tags" ] || [[ " $tags" == *" $tag "* ]] || die "the wheels in $WHEELS are built for ${tags% } and this \
Python ($py) is $tag: pip download them with the GPU machine's Python version (pip download --python-version \
${tag#cp} --only-binary=:all: ...)" 2
}
python_ready() {
  local missing pkg deps
  missing=$(missing_packages) || die "$py cannot run" 2
  if [ -n "$missing" ] && [ -n "${WHEELS:-}" ]; then
    say "will install from $WHEELS (no index): $missing"
    wheels_fit
  fi
  for pkg in $missing; do
    [ -n "${WHEELS:-}" ] || die "missing Python package '$pkg' and no WHEELS=DIR to install it from \
(pip download '$pkg' -d DIR where an index is reachable)" 2
    say "installing $pkg from $WHEELS"
    deps=()
    [ "$pkg" = qwen-vl-utils ] && deps=(--no-deps)  # images need none of its video dependencies (av, ...)
    "$py" -m pip install --no-index --find-links "$WHEELS" "${deps[@]}" "$pkg" \
      || die "pip could not install '$pkg' from $WHEELS: a wheel it needs is not there, or this Python is \
externally managed (PYTHON=a venv's python); pip's message is above" 2
  done
  missing=$(missing_packages) || die "$py cannot run" 2
  [ -z "$missing" ] || die "still missing after installing: $missing" 2
  export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
  "$py" -c "import vlmfast.cli" || die "vlmfast does not import with $py (see the error above)" 2
  "$py" - "$out/device.json" <<'PY' || die "no CUDA device visible to torch" 2
import json, sys, torch
assert torch.cuda.is_available()
json.dump({"gpu": torch.cuda.get_device_name(0), "cuda": torch.version.cuda}, open(sys.argv[1], "w"))
PY
}

# -- the plan: name, estimated seconds, the file that says it is done, the command -----------------
names=(); declare -A estimate marker command shown
step() {
  local name=$1 seconds=$2 done_file=$3
  shift 3
  names+=("$name"); estimate[$name]=$seconds; marker[$name]=$done_file
  command[$name]=$(printf '%q ' "$@"); shown[$name]="$*"
}
vlmfast() { "$py" -m vlmfast "$@"; }
infer_twice() {  # a fresh compile cache, so the first run compiles from scratch and the second finds it
  local ckpt=$1 dir=$2 run
  # run as a step inside `if`, where bash ignores `set -e`: every command checks its own status
  rm -rf "$dir" && mkdir -p "$dir" || return 1
  for run in first second; do
    VLMFAST_CACHE="$dir/cache" vlmfast infer --ckpt "$ckpt" --images "$out/images-32" --prompt "Describe this image." \
      --max-new-tokens 128 --ignore-eos --batch-size 32 --compile --out "$dir/$run.jsonl" --overwrite --json \
      > "$dir/$run.json.part" || return 1
    mv "$dir/$run.json.part" "$dir/$run.json" || return 1
  done
}

cuda_tests() {  # tests/test_cuda.py; its summary line is the step's report. Each test's outcome goes to the
  # step's log as it ends (a step killed at its limit still says where it was); a test past 120 s dumps its stack
  PYTHONUNBUFFERED=1 "$py" -m pytest -v -p no:cacheprovider -o faulthandler_timeout=120 tests/test_cuda.py 2>&1 \
    | tee "$1.part"
  [ "${PIPESTATUS[0]}" -eq 0 ] || return 1
  mv "$1.part" "$1"
}

whole_run() {  # a training run judged end to end: RUN_CKPTS checkpoints of one shape, one sweep, timed
  local size=$1 dir=$2 n=${RUN_CKPTS:-20} prompts=${RUN_PROMPTS:-500} tokens=${RUN_TOKENS:-512} k need free t0
  need=$(( n * $(size_gb "$size") ))
  free=$(df -BG --output=avail "$out" | tail -1 | tr -dc 0-9)
  # each checkpoint its own weights on disk (one file shared by all would be read from the page cache)
  [ "$free" -ge "$need" ] || { say "a whole run of $n $size checkpoints needs ~$need GB of disk and $free GB \
are free: set RUN_CKPTS=$(( free / $(size_gb "$size") )) or fewer"; return 1; }
  for k in $(seq 1 "$n"); do  # checkpoint-100, -200, ...: the same shape, weights of seed k
    [ -s "$dir/run/checkpoint-$((k * 100))/vlmfast_tiny.json" ] || vlmfast make-checkpoint \
      "$dir/run/checkpoint-$((k * 100))" --preset "$size" --like grpo --seed "$k" > /dev/null || return 1
  done
  [ -s "$out/images-$prompts/img_000.png" ] || vlmfast make-images "$out/images-$prompts" -n "$prompts" --size 448 > /dev/null \
    || return 1
  "$py" - "$out/images-$prompts" "$dir/manifest.jsonl" <<'PY' || return 1
import json, pathlib, sys
rows = [{"id": p.stem, "image": str(p), "prompt": "Describe this image.", "answer": "a"}
        for p in sorted(pathlib.Path(sys.argv[1]).glob("*.png"))]
pathlib.Path(sys.argv[2]).write_text("".join(json.dumps(r) + "\n" for r in rows))
PY
  t0=$SECONDS
  vlmfast sweep "$dir/run" --manifest "$dir/manifest.jsonl" --out-dir "$dir/sweep" --max-new-tokens "$tokens" \
    --ignore-eos --overwrite --json > "$dir/sweep.json.part" || return 1
  echo "{\"wall_s\": $(( SECONDS - t0 )), \"checkpoints\": $n, \"prompts\": $prompts, \"tokens\": $tokens, \"size\": \"$size\"}" \
    > "$dir/wall.json" || return 1
  mv "$dir/sweep.json.part" "$dir/sweep.json"
}
size_gb() { case $1 in 7b) echo 17 ;; *) echo 8 ;; esac; }  # a checkpoint's safetensors, rounded up

plan=${PLAN:-one}
case $plan in one|full) ;; *) die "unknown PLAN '$plan' (one, full)" 2 ;; esac
if [ $# -ge 1 ]; then
  ckpts=("$1")
elif [ "$plan" = one ]; then
  ckpts=("$out/ckpt/qwen2.5-vl-3b-grpo")
else
  ckpts=()
  for size in ${SIZES:-3b 7b}; do ckpts+=("$out/ckpt/qwen2.5-vl-$size-grpo"); done
fi
# PLAN=one: the CUDA-only tests first (tiny checkpoints: CUDA graphs, compiled steps, bf16, continuous
# admission between replays, MoE graphs; 33 tests: 30 took 84 s on an H100 in 0.18.3) ≈ 180 s, so a slice cut
# short still says whether the tokens hold
[ "$plan" = one ] && step cuda-tests 180 "$out/reports/cuda-tests.txt" cuda_tests "$out/reports/cuda-tests.txt"
# the vision tower of the 3B and 7B (the same config), per-window vs merged attention: 2 workloads ×
# 8 forwards × 2 ways of a 670M-parameter tower on 8k patches, random weights made on the GPU
[ "$plan" = full ] && step vision 120 "$out/reports/vision.json" "$py" benchmarks/bench_vision.py --preset 3b \
  --device cuda --dtype bfloat16 --json "$out/reports/vision.json"
est() { echo $(( $1 + large * $1 / 6 )); }  # the 7B steps take ~1/6 longer: 48 vs 42 ms per token, a longer load
for ckpt in "${ckpts[@]}"; do
  name=$(basename "$ckpt")
  large=0; [[ $name == *7b* ]] && large=1
  if [ $# -eq 0 ]; then
    size=${name#qwen2.5-vl-}; size=${size%-grpo}
    step "$name/build" "$(est "$([ "$plan" = one ] && echo 30 || echo 180)")" "$ckpt/vlmfast_tiny.json" \
      vlmfast make-checkpoint "$ckpt" --preset "$size" --like grpo
  fi
  common=(--ckpt "$ckpt" --max-new-tokens 128 --ignore-eos --no-as-saved --warmup 1 --repeats 3)
  modes=${MODES:-default compile hf}
  [ "$plan" = one ] && modes=default
  for mode in $modes; do
    # estimates (3B): batch 1 = 4,096 token-steps × 42 ms + 60 s load ≈ 230 s (compiled: 6.4 ms + a 42-s
    # compile ≈ 130 s); batches 8 and 32 = 2,560 steps × ≤ 92 ms + load ≈ 300 s (compiled: 2 compiles +
    # 31 s of runs ≈ 175 s); generate at batch 32 = 512 steps × ~60 ms + 4 prefills + load ≈ 105 s
    case $mode in
      default) extra=(); one=280; many=300 ;;
      compile) extra=(--compile); one=220; many=280 ;;
      hf) extra=(--decoder hf); one=300; many=160 ;;
      *) die "unknown mode '$mode' in MODES (default, compile, hf)" 2 ;;
    esac
    [ "$mode" = hf ] && sizes=32 || sizes=8,32
    [ "$plan" = one ] && { one=50; many=50; sizes=32; }
    r=$out/reports/$name-$mode
    step "$name/$mode-b1" "$(est $one)" "$r-b1/report.json" vlmfast bench "${common[@]}" "${extra[@]}" \
      --images "$out/images-8" --batch-sizes 1 --report "$r-b1"
    step "$name/$mode-b${sizes//,/-}" "$(est $many)" "$r-b${sizes//,/-}/report.json" vlmfast bench "${common[@]}" \
      "${extra[@]}" --images "$out/images-32" --batch-sizes "$sizes" --report "$r-b${sizes//,/-}"
  done
  # PLAN=one: the compiled batch-1 step as `--compile` runs it (on CUDA its attention by two matrix products,
  # the default), then with SDPA's attention (VLMFAST_DECODE_ATTENTION=sdpa; the table's mode "compile, SDPA
  # attention"): each a load + a compile of the step and the vision blocks (cold) + 4 × 1,024 steps ≈ 100 s
  if [ "$plan" = one ]; then
    step "$name/compile-b1" "$(est 100)" "$out/reports/$name-compile-b1/report.json" vlmfast bench \
      "${common[@]}" --compile --images "$out/images-8" --batch-sizes 1 --report "$out/reports/$name-compile-b1"
    step "$name/compile-sdpa-b1" "$(est 100)" "$out/reports/$name-compile-sdpa-b1/report.json" \
      VLMFAST_DECODE_ATTENTION=sdpa vlmfast bench "${common[@]}" --compile --images "$out/images-8" \
      --batch-sizes 1 --report "$out/reports/$name-compile-sdpa-b1"
  fi
  # two infers: load + compile (cold, then warm) + one batch of 32 each ≈ 215 s
  [ "$plan" = full ] && step "$name/infer" "$(est 280)" "$out/reports/$name-infer/second.json" infer_twice "$ckpt" \
    "$out/reports/$name-infer"
  # answers of real lengths: 8 images × 4 draws × 8 sampled answers up to 512 tokens, static batches then
  # continuous batching in 32 rows (1 warm-up + 3 runs each ≈ 8 runs × ~4,000 steps × ≤ 5 ms) + a load ≈ 240 s;
  # PLAN=full also runs continuous batching with 0.10's admission (at a quarter of the rows free) beside the
  # device's own; PLAN=one: 1 warm-up + 1 run of each of the two ≈ 100 s
  preset=${name#qwen2.5-vl-}; preset=${preset%-grpo}; [[ $preset == 3b || $preset == 7b ]] || preset=3b
  runs=3; mix=static,continuous,quarter; [ "$plan" = one ] && { runs=1; mix=static,continuous; }
  step "$name/lengths" "$(est "$([ "$plan" = one ] && echo 100 || echo 240)")" "$out/reports/$name-lengths.json" \
    "$py" benchmarks/bench_lengths.py --preset "$preset" --ckpt "$ckpt" --device cuda --dtype bfloat16 --no-vllm \
    --runs "$runs" --modes "$mix" --json "$out/reports/$name-lengths.json"
  # where the time to the first token goes: one prefill of 32 × 448 px, part by part and under the profiler
  # (PLAN=full; `bench` splits the TTFT into vision and language model in every plan): a load + 8 prefills
  # ≈ 30 s (21 s on an H200 in 0.13); then with the vision blocks compiled (as --compile runs them): + a
  # compile of two block graphs ≈ 45 s (29 s)
  [ "$plan" = full ] && step "$name/prefill" "$(est 30)" "$out/reports/$name-prefill.json" "$py" \
    benchmarks/profile_prefill.py "$ckpt" "$out/images-32" --batch 32 --json "$out/reports/$name-prefill.json"
  step "$name/prefill-compiled" "$(est 45)" "$out/reports/$name-compiled-prefill.json" "$py" \
    benchmarks/profile_prefill.py "$ckpt" "$out/images-32" --batch 32 --compile \
    --json "$out/reports/$name-compiled-prefill.json"
  # the decode step's attention alone, SDPA against two matrix products, compiled and uncompiled, replayed
  # from CUDA graphs: 8 compiles + 16 timings ≈ 40 s (31 s on an H100 in 0.14)
  step "$name/decode-attention" "$(est 40)" "$out/reports/$name-decode-attention.json" "$py" \
    benchmarks/bench_decode_attention.py --device cuda --json "$out/reports/$name-decode-attention.json"
  # the compiled decode step's kernels per layer in Triton (PLAN=full; 10 generated per layer on an H200 in
  # 0.13): a load + two compiles of a 1- and 2-layer step ≈ 60 s
  step "$name/kernels" "$(est 60)" "$out/reports/$name-kernels.json" "$py" benchmarks/bench_kernels.py \
    --ckpt "$ckpt" --families qwen2_5_vl --device cuda --dtype bfloat16 --json "$out/reports/$name-kernels.json"
done
# the CUDA-only tests (tiny checkpoints: CUDA graphs, compiled steps, bf16, prefetch) ≈ 120 s
[ "$plan" = full ] && step cuda-tests 120 "$out/reports/cuda-tests.txt" cuda_tests "$out/reports/cuda-tests.txt"
# a whole run (RUN_SIZE=7b: 20 checkpoints × 500 prompts × 512 tokens, swaps included; target 15 min): the
# one step longer than a slice. Its estimate: ~40 s to build each checkpoint, the tokens at 3,000 per second
if [ $# -eq 0 ] && [ -n "${RUN_SIZE:-}" ]; then
  rs=$RUN_SIZE
  step "run-$rs-x${RUN_CKPTS:-20}" $(( ${RUN_CKPTS:-20} * 40 + ${RUN_CKPTS:-20} * ${RUN_PROMPTS:-500} * ${RUN_TOKENS:-512} / 3000 + 60 )) \
    "$out/reports/run-$rs/sweep.json" whole_run "$rs" "$out/reports/run-$rs"
fi

# PLAN=one runs its steps by value, for a slice cut short: the tokens' tests, the batch-32 targets (TTFT,
# 32 × 128 tokens/s), what only the GPU can say about the compiled step (both attentions), then the rest (a whole run, if asked, stays last)
if [ "$plan" = one ]; then
  ordered=()
  for s in cuda-tests build default-b32 compile-b1 compile-sdpa-b1 default-b1 kernels decode-attention \
           prefill-compiled lengths; do
    for n in "${names[@]}"; do [ "${n##*/}" = "$s" ] && ordered+=("$n"); done
  done
  for n in "${names[@]}"; do [[ " ${ordered[*]} " == *" $n "* ]] || ordered+=("$n"); done
  names=("${ordered[@]}")
fi
limit() { echo "${STEP_LIMIT_S:-$(( 2 * ${estimate[$1]} + 60 ))}"; }

# -- run what is not done, within the slice ------------------------------------------------------
todo=()
for n in "${names[@]}"; do
  if [ -s "${marker[$n]}" ]; then
    echo "skip  $n  (done: ${marker[$n]})"
  elif [ -n "${ONLY:-}" ] && ! [[ $n =~ $ONLY ]]; then
    echo "skip  $n  (not in ONLY=$ONLY)"
  else
    echo "run   $n  ~${estimate[$n]} s, limit $(limit "$n") s: ${shown[$n]}"
    todo+=("$n")
  fi
done
[ "$dry" = 1 ] && exit 0

deliver() {  # the small results into $OUT/gpu-bench, unless OUT_DIR is there already
  [ -n "${OUT:-}" ] || return 0
  local dest here
  dest=$(realpath -m "$OUT/gpu-bench"); here=$(realpath -m "$out")
  [ "$(realpath -m "$OUT")" != "$here" ] && [ "$dest" != "$here" ] || return 0
  mkdir -p "$dest" || return 0
  # one archive, replaced whole: the tool brings back 8 files at most, none deeper than $OUT/a/b/file
  [ ! -d "$out/reports" ] || (cd "$out" && find reports \( -name cache -o -name 'checkpoint-*' \) -prune -o -type f \
    \( -name '*.json' -o -name '*.txt' -o -name '*.log' -o -name '*.part' \) -size -5120k -print0 \
    | tar -czf "$dest/reports.tar.gz.tmp" --null -T - && mv -f "$dest/reports.tar.gz.tmp" "$dest/reports.tar.gz")
  for f in "$out/device.json" "$out/table.md"; do [ ! -f "$f" ] || cp "$f" "$dest/"; done
  [ "${WRITE_RESULTS:-1}" != 1 ] || cp benchmarks/RESULTS.md "$dest/"
}
table() {  # one table from what every finished report says, this slice's and earlier ones
  if [ "${WRITE_RESULTS:-1}" = 1 ]; then "$py" benchmarks/gpu_table.py "$out" --write; else "$py" benchmarks/gpu_table.py "$out"; fi
}
stop() {  # SIGTERM (a `timeout` around the script) or SIGINT: end the running step's processes, then deliver
  trap '' TERM INT
  say "stopped by SIG$1${step_pid:+: ending the running step}"
  [ -z "$step_pid" ] || { kill -TERM "$step_pid" 2> /dev/null; wait "$step_pid" 2> /dev/null; } || true
  exit "$2"
}
step_pid=
trap 'deliver || true' EXIT
trap 'stop TERM 143' TERM
trap 'stop INT 130' INT
mkdir -p "$out/reports"
python_ready
[ -s "$out/images-32/img_031.png" ] || vlmfast make-images "$out/images-32" -n 32 --size 448 > /dev/null
[ -s "$out/images-8/img_007.png" ] || vlmfast make-images "$out/images-8" -n 8 --size 448 > /dev/null  # = the first 8
# a step runs in `bash -c` under `timeout`, its own process group: its limit or a stop kills the whole tree
# unbuffered: a step killed at its limit or by a stop leaves in its log what it printed so far
export py out PYTHONUNBUFFERED=1
export -f say vlmfast infer_twice cuda_tests whole_run size_gb
tried=0; ran=0; failed=
for n in "${todo[@]}"; do
  if [ $tried -gt 0 ] && [ $(( SECONDS + ${estimate[$n]} )) -gt "${SLICE_S:-420}" ]; then
    break
  fi
  tried=$((tried + 1))
  say "$n (estimate ${estimate[$n]} s, limit $(limit "$n") s)"
  log=$out/reports/${n//\//-}.log
  # in the background, so that a signal's trap runs at once rather than when the step ends
  timeout -k 10 "$(limit "$n")" bash -c "${command[$n]}" > "$log" 2>&1 &
  step_pid=$!
  status=0; wait "$step_pid" || status=$?
  step_pid=
  table > /dev/null || say "gpu_table.py failed (above); the steps go on"
  deliver || true
  if [ $status -ne 0 ]; then
    if [ $status -eq 124 ] || [ $status -eq 137 ]; then
      echo "[gpu.sh] $n ran past its limit of $(limit "$n") s: killed" >> "$log"
    fi
    tail -n 30 "$log" >&2
    failed="$failed $n"
    [ "${KEEP_GOING:-0}" = 1 ] || break
    say "$n failed; KEEP_GOING=1: on to the next step"
    continue
  fi
  ran=$((ran + 1))
  say "$n done; $SECONDS s since the start"
done
table
[ -z "$failed" ] || die "step(s)$failed failed (logs: $out/reports/*.log)"
left=$(( ${#todo[@]} - ran ))
[ $left -eq 0 ] || { say "$left step(s) left: run the same command again"; exit 75; }
