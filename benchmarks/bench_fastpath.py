"""Issue #6 CPU benchmark: how close vlmfast's wall time is to bare ``model.generate``, side by side.

Workload: demo GRPO-like checkpoint, 32 images, 64 new tokens each (forced), greedy, CPU float32.

  loop-cache-on   the seeds' per-sample loop with use_cache=True (preprocessing inside the loop)
  vlmfast         vlmfast.infer (batch 8, defaults): generate_s — preprocess, prefill, decode, writing
  bare-generate   Σ model.generate over vlmfast's own batches, inputs prepared outside the clock:
                  the floor vlmfast's wall time is compared to (target: vlmfast ÷ bare ≤ 1.05)

Each repetition runs every scenario once, interleaved; medians. Run:
  .venv/bin/python benchmarks/bench_fastpath.py --write
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench_infer import PROMPT, per_sample_loop, record


def bare_generate_s(loaded, requests, sizes, batch_size: int, new_tokens: int) -> float:
    """Σ of model.generate alone over the batches vlmfast would form (inputs built beforehand)."""
    import torch

    from vlmfast.engine import Engine, GenerationSettings

    engine = Engine(loaded, GenerationSettings(max_new_tokens=new_tokens, ignore_eos=True), overlap=False)
    prepared = [engine.preprocess([requests[i] for i in b]) for b in engine.plan(requests, sizes, batch_size)]
    total = 0.0
    for inputs in prepared:
        start = time.perf_counter()
        with torch.inference_mode():
            loaded.model.generate(**inputs, **engine.generate_kwargs)
        total += time.perf_counter() - start
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--images", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()

    import torch
    import transformers

    from vlmfast.checkpoint import load
    from vlmfast.demo import DEMO_IMAGE_SIZES
    from vlmfast.engine import GenerationSettings
    from vlmfast.inputs import collect
    from vlmfast.runner import InferOptions, infer
    from vlmfast.tiny import build_checkpoint, make_images

    work = Path(tempfile.mkdtemp(prefix="vlmfast-bench-fast-"))
    ckpt = str(build_checkpoint(work / "grpo-demo", preset="demo", like="grpo"))
    images = [str(p) for p in make_images(work / "images", n=args.images, sizes=DEMO_IMAGE_SIZES)]
    loaded = load(ckpt)
    collected = collect(images=images, prompt=PROMPT)

    def vlmfast_s() -> float:
        report = infer(InferOptions(ckpt=ckpt, images=images, prompt=PROMPT, batch_size=args.batch_size,
                                    out=str(Path(tempfile.mkdtemp()) / "r.jsonl"),
                                    generation=GenerationSettings(max_new_tokens=args.new_tokens, ignore_eos=True)),
                       loaded=loaded)
        return report.generate_s

    scenarios = {
        "loop-cache-on": lambda: per_sample_loop(ckpt, images, args.new_tokens, True),
        "vlmfast": vlmfast_s,
        "bare-generate": lambda: bare_generate_s(loaded, collected.requests, collected.image_sizes,
                                                 args.batch_size, args.new_tokens),
    }
    for fn in scenarios.values():  # warm-up, untimed
        fn()
    times: dict[str, list[float]] = {name: [] for name in scenarios}
    for rep in range(args.runs):
        for name, fn in scenarios.items():
            times[name].append(fn())
            print(f"run {rep + 1}/{args.runs} {name}: {times[name][-1]:.2f} s", file=sys.stderr)
    med = {name: statistics.median(ts) for name, ts in times.items()}
    text = "\n".join([
        f"### Fast path on CPU — transformers {transformers.__version__}, torch {torch.__version__}",
        "",
        f"Demo GRPO-like checkpoint, {args.images} images (64–81 image tokens), {args.new_tokens} new tokens each "
        f"(forced), greedy, float32 + sdpa, {torch.get_num_threads()} threads, vlmfast batch {args.batch_size} (overlap "
        f"auto: off on a CPU); 1 warm-up + median of {args.runs} interleaved runs (all runs: "
        + "; ".join(f"{n} " + ", ".join(f"{t:.2f}" for t in ts) for n, ts in times.items()) + " s).",
        "",
        "| figure | value | target |",
        "|---|---|---|",
        f"| loop-cache-on ÷ vlmfast (`generate_s`) | {med['loop-cache-on'] / med['vlmfast']:.2f}× | ≥ 4× |",
        f"| vlmfast wall after load ÷ Σ bare `model.generate` on the same batches | {med['vlmfast'] / med['bare-generate']:.3f} | ≤ 1.05 |",
        f"| seconds: loop-cache-on / vlmfast / bare-generate | {med['loop-cache-on']:.2f} / {med['vlmfast']:.2f} / {med['bare-generate']:.2f} | |",
        "",
    ])
    print(text)
    if args.write:
        record(text, f"fastpath-tf{transformers.__version__.split('.')[0]}")


if __name__ == "__main__":
    main()
