"""Answers of real lengths: static batches against continuous batching, and vLLM on the same workload.

Forced-length figures (``--ignore-eos``) make every answer as long as the longest; GRPO answers spread
10× in length. Workload: the demo GRPO-like checkpoint, 8 images each asked ``--draws 4`` times under its
own id × ``--n 8`` sampled answers (256 answers, temperature 1.0, seed 0), ``--max-new-tokens 512``: its
random weights end answers anywhere from a few tokens to the limit (mean about half of it, some
truncated), as the sweep's health table shows for real runs. 32 decode rows for vlmfast, in both modes (the CPU default batch size). Figures per mode: useful
(answer) tokens per second of wall time, decode row utilization (answer tokens ÷ rows computed, summed
over steps), the answers' length spread. Each mode alone on the machine, one warm-up, median of --runs;
vLLM last (started once, before its clock), when it is importable (run this in .venv-vllm for it).
  .venv/bin/python benchmarks/bench_lengths.py --write
  .venv-vllm/bin/python benchmarks/bench_lengths.py --write --key lengths-vllm
On a GPU, the real shapes (``--preset 3b --device cuda --dtype bfloat16``; benchmarks/gpu.sh runs it): a
random 151k-token vocabulary almost never samples an EOS, so there every (max-new-tokens ÷ 2)-th token id
also ends an answer, which makes lengths spread about as the demo checkpoint's do (mean near half the limit).
"""

from __future__ import annotations

import argparse
import atexit
import dataclasses
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from bench_infer import record, run_interleaved

PROMPT = "What shapes are in this image? Think, then answer."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--draws", type=int, default=4, help="each image asked this many times (its own id each)")
    parser.add_argument("--new-tokens", type=int, default=512)
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--no-vllm", action="store_true")
    parser.add_argument("--preset", default="demo", help="demo | 3b | 7b (a checkpoint of that shape is built)")
    parser.add_argument("--ckpt", help="an existing checkpoint of --preset's shape instead of building one")
    parser.add_argument("--images", type=int, default=8)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--json", help="also write the figures as JSON here")
    parser.add_argument("--modes", default="static,continuous",
                        help="which of vlmfast's modes run: static, continuous (the device's admission policy), "
                        "quarter (continuous, admitting once a quarter of the rows are free: 0.10's policy on every "
                        "device). Static alone runs on vlmfast 0.6 too, whose static batches computed every row "
                        "until the longest answer ended: PYTHONPATH=OLD/src")
    parser.add_argument("--compile", action="store_true", help="compile the decode step (static shapes)")
    parser.add_argument("--label", default="", help="a prefix for the modes' names in the table (e.g. 0.6)")
    parser.add_argument("--write", action="store_true")
    parser.add_argument("--key", default="lengths")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    import torch
    import transformers

    from vlmfast.checkpoints.load import load
    from vlmfast.checkpoints.tiny import build_checkpoint, make_images
    from vlmfast.cli.demo import DEMO_IMAGE_SIZES
    from vlmfast.engines.hf.continuous import AdmitPolicy
    from vlmfast.engines.hf.engine import Engine, GenerationSettings
    from vlmfast.engines.hf.scheduler import Scheduler
    from vlmfast.inputs.requests import collect

    work = Path(tempfile.mkdtemp(prefix="vlmfast-bench-lengths-"))
    atexit.register(shutil.rmtree, work, True)  # the made checkpoint and images go with the run
    ckpt = args.ckpt or str(build_checkpoint(work / f"grpo-{args.preset}", preset=args.preset, like="grpo"))
    images = [str(p) for p in make_images(work / "images", n=args.images, sizes=DEMO_IMAGE_SIZES)]
    # each image asked --draws times under its own id: every draw samples its own answers, so the mix's
    # lengths (and the last answers' tail, where few rows run) depend less on one draw's luck. The ids
    # name the image file, not its temporary folder: a draw is keyed by (seed, id, sample), so every
    # invocation (and every version since draws were keyed so) samples the same answers
    requests = [dataclasses.replace(r, id=f"{Path(r.id).name}#{k}") for k in range(args.draws)
                for r in collect(images=images, prompt=PROMPT).requests]
    settings = GenerationSettings(max_new_tokens=args.new_tokens, temperature=1.0, seed=0, n=args.n)
    loaded = load(ckpt, device=args.device, dtype=args.dtype)
    if args.preset != "demo":
        vocab = loaded.model.config.get_text_config().vocab_size
        stops = range(0, vocab, max(1, args.new_tokens // 2))
        loaded = dataclasses.replace(loaded, eos_token_ids=sorted({*loaded.eos_token_ids, *stops}))
    engine = Engine(loaded, settings, compile=args.compile)
    scheduler = Scheduler(engine)
    order = list(range(len(requests)))
    last: dict[str, tuple[list, list]] = {}

    def run(name, items) -> float:
        start = time.perf_counter()
        rows, timings = [], []
        for _, rs, timing in items():
            rows += rs
            timings += [timing] if timing is not None else []
        last[name] = (rows, timings)
        return time.perf_counter() - start

    label = f"{args.label} " if args.label else ""
    quarter = AdmitPolicy(0.25, 0.0, "once a quarter of the rows are free, prefill what they take")  # 0.10's
    modes = {
        "static": (f"{label}static batches", lambda: scheduler.run(requests, {}, args.rows // args.n)),
        "continuous": (f"{label}continuous", lambda: scheduler.continuous(requests, {}, order, args.rows)),
        "quarter": (f"{label}continuous, admitting at a quarter free",
                    lambda: scheduler.continuous(requests, {}, order, args.rows, quarter)),
    }
    scenarios = {name: (lambda name=name, items=items: run(name, items))
                 for mode, (name, items) in modes.items() if mode in args.modes.split(",")}
    times = {}
    for name, fn in scenarios.items():  # each alone: its own warm-up and runs
        times |= run_interleaved({name: fn}, args.runs)
    vllm_version = None
    if not args.no_vllm and args.preset == "demo":
        import importlib.util

        if importlib.util.find_spec("vllm") is not None:  # (this environment has vLLM)
            from vlmfast.engines.vllm.backend import VllmBackend
            vllm = VllmBackend(ckpt, settings)
            startup = vllm.start(requests)
            vllm_version = vllm.vllm_version
            try:
                times |= run_interleaved({"vLLM-CPU": lambda: run("vLLM-CPU", lambda: vllm.run(requests, {}, args.rows))},
                                         args.runs)
            finally:
                vllm.close()
    dtype = str(loaded.model.dtype).removeprefix("torch.")
    lines = [
        f"### Answers of real lengths — transformers {transformers.__version__}, torch {torch.__version__}"
        + (f", vLLM {vllm_version}" if vllm_version else ""),
        "",
        f"{args.preset} GRPO-like checkpoint on {engine.device}, {args.images} images × {args.draws} draws (ids) × --n {args.n} sampled answers "
        f"({len(requests) * args.n} answers, temperature 1.0, seed 0), "
        f"--max-new-tokens {args.new_tokens}, {args.rows} decode rows, {dtype}"
        + (f", {torch.get_num_threads()} threads" if engine.device == "cpu" else "")
        + (f"; vLLM eager, started once before its clock ({startup:.1f} s)" if vllm_version else "")
        + f". Each engine alone, 1 warm-up + median of {args.runs} runs (s: "
        + "; ".join(f"{n} " + ", ".join(f"{t:.2f}" for t in ts) for n, ts in times.items()) + ").",
        "",
        "| mode | answers | length p10 / p50 / p90 / max | at the limit | useful tokens/s | decode row utilization |",
        "|---|---|---|---|---|---|",
    ]
    rate, figures = {}, {}
    for name, (rows, timings) in last.items():
        lengths = sorted(r.n_new_tokens for r in rows if r.error is None)
        useful = sum(lengths)
        rate[name] = useful / statistics.median(times[name])
        # vlmfast 0.6 did not count row-steps: its static batches computed every row for every step; vLLM's
        # scheduler is its own (not counted)
        row_steps = 0 if name == "vLLM-CPU" else (sum(getattr(t, "row_steps", 0) for t in timings)
                                                  or sum(t.size * args.n * t.steps for t in timings))
        pct = lambda q: lengths[min(len(lengths) - 1, int(q * len(lengths)))]  # noqa: E731
        total = lambda items, field: sum(getattr(t, field, None) or 0 for t in items)  # noqa: E731
        lines.append(f"| {name} | {len(lengths)} | {pct(0.1)} / {pct(0.5)} / {pct(0.9)} / {lengths[-1]} | "
                     f"{sum(n >= args.new_tokens for n in lengths)} | {rate[name]:,.0f} | "
                     + (f"{useful / row_steps:.0%} ({useful:,} of {row_steps:,} row-steps) |" if row_steps else "– |"))
        # where the last run's time went: prefills (stalling every row), cache copies, decode steps
        admissions = [t for t in timings if getattr(t, "size", 0)]
        figures[name] = {"answer_tokens": useful, "row_steps": row_steps, "at_limit": sum(n >= args.new_tokens for n in lengths),
                         "length_p10_p50_p90_max": [pct(0.1), pct(0.5), pct(0.9), lengths[-1]],
                         "prefills": len(admissions), "prefill_s": total(admissions, "ttft_s"),
                         "cache_fill_s": total(timings, "cache_fill_s"),  # None where an engine does not time it
                         "decode_s": total(timings, "decode_s"), "decode_steps": total(timings, "steps")}
    ratios = [f"{a} ÷ {b}: **{rate[a] / rate[b]:.2f}×**" for a, b in ((f"{label}continuous", f"{label}static batches"),
                                                                        (f"{label}continuous, admitting at a quarter free", f"{label}static batches"),
                                                                        (f"{label}continuous", "vLLM-CPU")) if a in rate and b in rate]
    lines += ["", "Useful tokens/s, " + "; ".join(ratios) + ".", ""] if ratios else [""]
    text = "\n".join(lines)
    print(text)
    if args.json:
        import json

        Path(args.json).write_text(json.dumps({"preset": args.preset, "device": engine.device, "dtype": dtype,
                                               "useful_tokens_per_s": rate, "seconds": times, "modes": figures,
                                               "admissions": getattr(engine, "admissions", None)}, indent=1))
    if args.write:
        record(text, args.key)


if __name__ == "__main__":
    main()
