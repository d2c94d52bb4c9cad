"""A sweep over 4 checkpoints of the same shapes: what it costs to go from one checkpoint to the next.

Workload: 4 checkpoints of one run (GRPO-like, different weight seeds; the demo preset's vision tower
and a language model of --hidden × --layers, ~400 MB of float32 weights by default, so that loading
weighs something), a manifest of 8 images, 8 new tokens, float32 on the CPU. Per transition k → k+1 the sweep copies the next weights into
the loaded model (no reload). Measured, per repetition (a fresh output dir each, medians):
  gap       from the end of checkpoint k's run to checkpoint k+1's first prefill: the swap, reading the
            results back, collecting the next run's inputs, and preparing its first batch (images and
            processor, which does not depend on the checkpoint: reported apart)
  read      reading the next checkpoint's safetensors file into memory (page cache warm, as in the sweep)
  load      a fresh load of that checkpoint (what a shell loop over checkpoints pays)
Run:
  .venv/bin/python benchmarks/bench_sweep.py --write
"""

from __future__ import annotations

import argparse
import atexit
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench_infer import PROMPT, record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()

    import torch
    import transformers

    import vlmfast.run.runner
    from vlmfast.checkpoints import tiny
    from vlmfast.checkpoints.load import load
    from vlmfast.engines.hf.engine import Engine
    from vlmfast.run.options import InferOptions
    from vlmfast.engines.rows import GenerationSettings
    from vlmfast.run.sweep import SweepOptions, sweep
    from vlmfast.checkpoints.tiny import build_checkpoint, make_images

    work = Path(tempfile.mkdtemp(prefix="vlmfast-bench-sweep-"))
    atexit.register(shutil.rmtree, work, True)  # what the run made goes with it
    size = dict(tiny.PRESETS["demo"])  # a benchmark-only preset: the demo's vision tower, a bigger language model
    size["text"] = {**size["text"], "hidden_size": args.hidden, "intermediate_size": 4 * args.hidden,
                    "num_hidden_layers": args.layers, "num_attention_heads": args.hidden // 64, "num_key_value_heads": 2,
                    "mrope_section": [8, 12, 12]}
    tiny.PRESETS["sweep-bench"] = size
    for k, step in enumerate((100, 200, 300, 400)):
        build_checkpoint(work / "run" / f"checkpoint-{step}", preset="sweep-bench", like="grpo", seed=k)
    images = make_images(work / "images", n=8)
    manifest = work / "m.jsonl"
    manifest.write_text("".join(json.dumps({"id": f"q{i}", "image": str(p), "prompt": PROMPT}) + "\n" for i, p in enumerate(images)))

    marks: list[tuple[str, float]] = []
    real_infer, real_prefill, real_batch = vlmfast.run.runner.infer, Engine.prefill, Engine.generate_batch

    def timed_infer(*a, **k):
        report = real_infer(*a, **k)
        marks.append(("end", time.perf_counter()))
        return report

    def timed_prefill(self, prepared):
        marks.append(("prefill", time.perf_counter()))
        return real_prefill(self, prepared)

    def timed_batch(self, *a, **k):
        marks.append(("batch", time.perf_counter()))
        return real_batch(self, *a, **k)

    vlmfast.run.runner.infer, Engine.prefill, Engine.generate_batch = timed_infer, timed_prefill, timed_batch
    gaps, prepares, swaps, reads, loads, how = [], [], [], [], [], []
    for rep in range(args.runs + 1):  # the first repetition warms up
        marks.clear()
        infer_options = InferOptions(ckpt=str(work / "run"), manifest=str(manifest), device="cpu",
                                     generation=GenerationSettings(max_new_tokens=8, ignore_eos=True))
        report = sweep(SweepOptions(run_dir=str(work / "run"), out_dir=str(work / f"out{rep}"), infer=infer_options))
        ends = [t for kind, t in marks if kind == "end"]
        firsts = [next(t for kind, t in marks if kind == "prefill" and t > end) for end in ends[:-1]]
        batches = [next(t for kind, t in marks if kind == "batch" and t > end) for end in ends[:-1]]
        for c in report["checkpoints"][1:]:
            start = time.perf_counter()
            Path(c["path"], "model.safetensors").read_bytes()
            read_s = time.perf_counter() - start
            start = time.perf_counter()
            load(c["path"], device="cpu")
            load_s = time.perf_counter() - start
            if rep:
                reads.append(read_s)
                loads.append(load_s)
        if rep:
            gaps += [b - a for a, b in zip(ends, firsts)]
            prepares += [p - b for b, p in zip(batches, firsts)]
            swaps += [c.get("swap_s", c.get("load_s")) for c in report["checkpoints"][1:]]
            how += ["swap" if "swap_s" in c else "load" for c in report["checkpoints"][1:]]
        print(f"repetition {rep}: gaps {[round(b - a, 4) for a, b in zip(ends, firsts)]}", file=sys.stderr)
    gap, read, fresh = statistics.median(gaps), statistics.median(reads), statistics.median(loads)
    prepare, swap = statistics.median(prepares), statistics.median(swaps)
    switch = gap - prepare  # what going to the next checkpoint costs, its first batch's preprocessing aside
    size_mb = Path(work / "run" / "checkpoint-200" / "model.safetensors").stat().st_size / 1e6
    text = "\n".join([
        f"### Sweep: from one checkpoint to the next — transformers {transformers.__version__}, torch {torch.__version__}",
        "",
        f"4 checkpoints of one run ({size_mb:.0f} MB of float32 weights each), 8 images, 8 new tokens (forced), "
        f"CPU float32, {torch.get_num_threads()} threads; {args.runs} sweeps after a warm-up one, {len(gaps)} transitions "
        f"({', '.join(sorted(set(how)))}), medians (gaps, s: {', '.join(f'{g:.3f}' for g in gaps)}).",
        "",
        "| figure | seconds | ratio | target |",
        "|---|---|---|---|",
        f"| last row of checkpoint k → first prefill of k+1 | {gap:.3f} | {gap / read:.2f}× the file read | ≤ 1.5× |",
        f"| of which: preparing the first batch (images, processor; any checkpoint) | {prepare:.3f} | | |",
        f"| of which: the rest — the switch (the swap itself: {swap:.3f}) | {switch:.3f} | {switch / read:.2f}× the file read | |",
        f"| reading the next checkpoint's safetensors | {read:.3f} | | |",
        f"| a fresh load of it instead | {fresh:.3f} | {fresh / gap:.1f}× the sweep's gap | ≥ 3× |",
        "",
    ])
    print(text)
    if args.write:
        record(text, f"sweep-tf{transformers.__version__.split('.')[0]}")


if __name__ == "__main__":
    main()
