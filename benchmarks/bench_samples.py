"""n answers per request from one prefill vs the same answers as separate requests, side by side.

Workload: the demo GRPO-like checkpoint, 8 images of mixed sizes (224–640 px), 64 new tokens (forced),
temperature 1.0, float32 on the CPU, one batch of 64 answers either way:
  n8          8 requests with --n 8: each prompt prefilled once, its KV cache copied to 8 decode rows
  separate    the 64 answers as 64 requests (8 copies of each request, distinct ids): 64 prefills
Each repetition runs both, interleaved; medians of generate_s. Run:
  .venv/bin/python benchmarks/bench_samples.py --write
"""

from __future__ import annotations

import argparse
import atexit
import json
import shutil
import statistics
import tempfile
from pathlib import Path

from bench_decode import SIZES
from bench_infer import PROMPT, record, run_interleaved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()

    import torch
    import transformers

    from vlmfast.checkpoints.load import load
    from vlmfast.run.options import InferOptions
    from vlmfast.engines.rows import GenerationSettings
    from vlmfast.run.runner import infer
    from vlmfast.checkpoints.tiny import build_checkpoint, make_images

    work = Path(tempfile.mkdtemp(prefix="vlmfast-bench-samples-"))
    atexit.register(shutil.rmtree, work, True)  # what the run made goes with it
    ckpt = str(build_checkpoint(work / "grpo-demo", preset="demo", like="grpo"))
    images = [str(p) for p in make_images(work / "images", n=8, sizes=SIZES)]
    grouped, separate = work / "grouped.jsonl", work / "separate.jsonl"
    grouped.write_text("".join(json.dumps({"id": f"q{i}", "image": p, "prompt": PROMPT}) + "\n" for i, p in enumerate(images)))
    separate.write_text("".join(json.dumps({"id": f"q{i}-copy{k}", "image": p, "prompt": PROMPT}) + "\n"
                                for i, p in enumerate(images) for k in range(args.n)))
    loaded = load(ckpt, device="cpu")
    answers = len(images) * args.n
    last = {}

    def run(name: str, manifest: Path, n: int):
        def go() -> float:
            settings = GenerationSettings(max_new_tokens=args.new_tokens, temperature=1.0, seed=0, ignore_eos=True, n=n)
            report = infer(InferOptions(ckpt=ckpt, manifest=str(manifest), out=str(work / f"{name}.jsonl"), overwrite=True,
                                        batch_size=answers, generation=settings), loaded=loaded)
            assert report.samples == answers and report.new_tokens == answers * args.new_tokens, report.samples
            last[name] = report
            return report.generate_s
        return go

    times = run_interleaved({"n8": run("n8", grouped, args.n), "separate": run("separate", separate, 1)}, args.runs)
    med = {name: statistics.median(ts) for name, ts in times.items()}
    a, b = last["n8"], last["separate"]
    text = "\n".join([
        f"### n answers from one prefill — transformers {transformers.__version__}, torch {torch.__version__}",
        "",
        f"Demo GRPO-like checkpoint, 8 images of mixed sizes (224–640 px), {args.n} answers each = {answers} answers "
        f"of {args.new_tokens} tokens (forced), temperature 1.0, float32 + sdpa, {torch.get_num_threads()} threads, one "
        f"batch of {answers} answers; 1 warm-up + median of {args.runs} interleaved runs (all runs, s: "
        + "; ".join(f"{n} " + ", ".join(f"{t:.2f}" for t in ts) for n, ts in times.items()) + ").",
        "",
        "| | --n 8 (8 requests) | 64 separate requests |",
        "|---|---|---|",
        f"| generate_s (median) | {med['n8']:.2f} | {med['separate']:.2f} |",
        f"| prefill / vision / decode s (last run) | {a.prefill_s:.2f} / {a.vision_s:.2f} / {a.decode_s:.2f} | "
        f"{b.prefill_s:.2f} / {b.vision_s:.2f} / {b.decode_s:.2f} |",
        "",
        f"Speed-up of `--n {args.n}` over separate requests: **{med['separate'] / med['n8']:.2f}×** (target ≥ 2×).",
        "",
    ])
    print(text)
    if args.write:
        record(text, f"samples-tf{transformers.__version__.split('.')[0]}")


if __name__ == "__main__":
    main()
