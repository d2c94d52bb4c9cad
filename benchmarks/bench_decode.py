"""CPU benchmark of vlmfast's own decode loop, side by side in one run.

Workload: the demo GRPO-like checkpoint, 32 images of mixed sizes (224–640 px, 64–256 image tokens),
64 new tokens each (forced), greedy, float32 + sdpa.

  loop-cache-on   the per-sample loop users write (processor → model.generate(use_cache=True)), one
                  image at a time
  vlmfast         vlmfast.infer with its defaults (own decode loop, batch size auto = 32 on a CPU)
  vlmfast-hf      the same with --decoder hf (plain model.generate on the same batches and inputs)

Figures: loop-cache-on ÷ vlmfast wall time (generate_s), and decode time per step of vlmfast-hf ÷
vlmfast (each from the report's decode_ms_per_token), plus how many rows have identical tokens between
the two vlmfast decoders. Each repetition runs every scenario once, interleaved; medians. Run:
  .venv/bin/python benchmarks/bench_decode.py --write
"""

from __future__ import annotations

import argparse
import atexit
import shutil
import statistics
import tempfile
from pathlib import Path

from bench_infer import PROMPT, per_sample_loop, record, run_interleaved

# (width, height): 64 to 256 image tokens each (one token per 28×28 block)
SIZES = [(224, 224), (640, 224), (448, 448), (320, 480), (640, 320), (280, 560), (512, 384), (400, 300)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--images", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()

    import torch
    import transformers

    from vlmfast.checkpoints.load import load
    from vlmfast.engines.hf.engine import GenerationSettings
    from vlmfast.run.runner import InferOptions, infer
    from vlmfast.checkpoints.tiny import build_checkpoint, make_images

    work = Path(tempfile.mkdtemp(prefix="vlmfast-bench-decode-"))
    atexit.register(shutil.rmtree, work, True)  # what the run made goes with it
    ckpt = str(build_checkpoint(work / "grpo-demo", preset="demo", like="grpo"))
    images = [str(p) for p in make_images(work / "images", n=args.images, sizes=SIZES)]
    loaded = load(ckpt)
    last: dict[str, object] = {}

    def vlmfast(decoder: str):
        def run() -> float:
            report = infer(InferOptions(ckpt=ckpt, images=images, prompt=PROMPT, decoder=decoder, out=str(work / f"{decoder}.jsonl"),
                                        overwrite=True, generation=GenerationSettings(max_new_tokens=args.new_tokens, ignore_eos=True)),
                           loaded=loaded)
            last[decoder] = report
            steps.setdefault(decoder, []).append(report.decode_ms_per_token)
            return report.generate_s
        return run

    steps: dict[str, list[float]] = {}
    scenarios = {
        "loop-cache-on": lambda: per_sample_loop(ckpt, images, args.new_tokens, True),
        "vlmfast": vlmfast("vlmfast"),
        "vlmfast-hf": vlmfast("hf"),
    }
    for fn in scenarios.values():  # warm-up, untimed
        fn()
    steps.clear()
    times = run_interleaved(scenarios, args.runs, warm_up=False)
    med = {name: statistics.median(ts) for name, ts in times.items()}
    step = {name: statistics.median(ms) for name, ms in steps.items()}
    same = sum(a.token_ids == b.token_ids for a, b in zip(last["vlmfast"].results, last["hf"].results))
    report = last["vlmfast"]
    text = "\n".join([
        f"### Own decode loop on CPU — transformers {transformers.__version__}, torch {torch.__version__}",
        "",
        f"Demo GRPO-like checkpoint, {args.images} images of mixed sizes (224–640 px, 64–256 image tokens), "
        f"{args.new_tokens} new tokens each (forced), greedy, float32 + sdpa, {torch.get_num_threads()} threads, "
        f"vlmfast defaults (batch {report.batch_size}, {report.batches} batch{'es' if report.batches != 1 else ''}); 1 warm-up + median of {args.runs} "
        "interleaved runs (all runs, s: "
        + "; ".join(f"{n} " + ", ".join(f"{t:.2f}" for t in ts) for n, ts in times.items())
        + "; decode ms/step: " + "; ".join(f"{n} " + ", ".join(f"{t:.2f}" for t in ms) for n, ms in steps.items()) + ").",
        "",
        "| figure | value | target |",
        "|---|---|---|",
        f"| loop-cache-on ÷ vlmfast (`generate_s`) | {med['loop-cache-on'] / med['vlmfast']:.2f}× | ≥ 4× |",
        f"| decode ms/step: `--decoder hf` ÷ vlmfast's loop | {step['hf'] / step['vlmfast']:.2f}× "
        f"({step['hf']:.2f} vs {step['vlmfast']:.2f} ms) | ≥ 1.3× |",
        f"| rows with identical greedy tokens, vlmfast loop vs `--decoder hf` | {same}/{len(report.results)} | all |",
        f"| seconds: loop-cache-on / vlmfast / vlmfast-hf | {med['loop-cache-on']:.2f} / {med['vlmfast']:.2f} / "
        f"{med['vlmfast-hf']:.2f} | |",
        f"| vlmfast prefill / vision tower / decode (s, last run) | {report.prefill_s:.2f} / {report.vision_s:.2f} / "
        f"{report.decode_s:.2f} | |",
        "",
    ])
    print(text)
    if args.write:
        record(text, f"decode-tf{transformers.__version__.split('.')[0]}")


if __name__ == "__main__":
    main()
