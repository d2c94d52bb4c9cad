"""vlmfast infer vs the per-sample HF loop users write, side by side in one run.

Workload: the demo GRPO-like checkpoint (saved with use_cache false), 8 images, 128 new tokens each
(forced length), greedy, CPU float32 + sdpa. Each repetition runs every scenario once, interleaved,
so drift affects all alike; figures are medians over the repetitions.

  loop-as-loaded   for each image: processor → model.generate(**inputs) on the model as from_pretrained
                   gives it (the saved generation config: cache off) — what users get today
  loop-cache-on    the same loop with use_cache=True
  vlmfast          vlmfast.infer(batch_size=8, ignore_eos): generate_s (preprocess + prefill + decode)

Also: `vlmfast --help` wall time (lazy imports). Run: .venv/bin/python benchmarks/bench_infer.py
"""

from __future__ import annotations

import argparse
import atexit
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROMPT = "What shapes are in this image?"


def per_sample_loop(ckpt: str, images: list[str], new_tokens: int, use_cache: bool | None) -> float:
    """The loop users write: one sample at a time, plain HF API, model loaded as saved."""
    import torch
    from qwen_vl_utils import fetch_image
    from transformers import AutoModelForImageTextToText, AutoProcessor

    model = AutoModelForImageTextToText.from_pretrained(ckpt, dtype=torch.float32, attn_implementation="sdpa").eval()
    processor = AutoProcessor.from_pretrained(ckpt)
    cfg = model.config
    suppress = [cfg.image_token_id, cfg.video_token_id, cfg.vision_start_token_id, cfg.vision_end_token_id]
    extra = {} if use_cache is None else {"use_cache": use_cache}
    start = time.perf_counter()
    for path in images:
        messages = [{"role": "user", "content": [{"type": "image", "image": path}, {"type": "text", "text": PROMPT}]}]
        text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        inputs = processor(text=[text], images=[fetch_image({"image": path, "max_pixels": 1280 * 28 * 28})],
                           return_tensors="pt")
        with torch.inference_mode():
            out = model.generate(**inputs, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                                 suppress_tokens=suppress, **extra)
        assert out.shape[1] - inputs["input_ids"].shape[1] == new_tokens
    return time.perf_counter() - start


def vlmfast_run(ckpt: str, images: list[str], new_tokens: int, batch_size: int) -> float:
    from vlmfast.engines.hf.engine import GenerationSettings
    from vlmfast.run.runner import InferOptions, infer

    out = Path(tempfile.mkdtemp(prefix="vlmfast-bench-out-")) / "results.jsonl"
    atexit.register(shutil.rmtree, out.parent, True)
    report = infer(InferOptions(ckpt=ckpt, images=images, prompt=PROMPT, batch_size=batch_size, out=str(out),
                                generation=GenerationSettings(max_new_tokens=new_tokens, ignore_eos=True)))
    assert report.new_tokens == new_tokens * len(images), report.new_tokens
    return report.generate_s


def run_interleaved(scenarios: dict, runs: int, warm_up: bool = True) -> dict[str, list[float]]:
    """Seconds of each scenario per repetition; every repetition runs every scenario once, in turn, so
    drift on the machine touches all alike (the medians are compared). One untimed warm-up first."""
    if warm_up:
        for fn in scenarios.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in scenarios}
    for rep in range(runs):
        for name, fn in scenarios.items():
            times[name].append(fn())
            print(f"run {rep + 1}/{runs} {name}: {times[name][-1]:.3f} s", file=sys.stderr)
    return times


def help_wall_s(runs: int) -> list[float]:
    exe = Path(sys.executable).parent / "vlmfast"
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run([str(exe), "--help"], check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--images", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--write", action="store_true", help="record the figures in benchmarks/RESULTS.md")
    args = parser.parse_args()

    import torch
    import transformers

    from vlmfast.cli.demo import DEMO_IMAGE_SIZES
    from vlmfast.checkpoints.tiny import build_checkpoint, make_images

    work = Path(tempfile.mkdtemp(prefix="vlmfast-bench-"))
    atexit.register(shutil.rmtree, work, True)  # what the run made goes with it
    ckpt = str(build_checkpoint(work / "grpo-demo", preset="demo", like="grpo"))
    images = [str(p) for p in make_images(work / "images", n=args.images, sizes=DEMO_IMAGE_SIZES)]

    scenarios = {
        "loop-as-loaded": lambda: per_sample_loop(ckpt, images, args.new_tokens, None),
        "loop-cache-on": lambda: per_sample_loop(ckpt, images, args.new_tokens, True),
        "vlmfast": lambda: vlmfast_run(ckpt, images, args.new_tokens, args.batch_size),
    }
    # Warm-up: first-call costs (allocator, kernel selection) are not the user's steady state.
    per_sample_loop(ckpt, images[:1], 4, True)
    vlmfast_run(ckpt, images[:2], 4, 2)
    times = run_interleaved(scenarios, args.runs, warm_up=False)
    med = {name: statistics.median(ts) for name, ts in times.items()}
    helps = help_wall_s(5)

    lines = [
        f"### vlmfast infer vs per-sample HF loop — transformers {transformers.__version__}, torch {torch.__version__}",
        "",
        f"Demo GRPO-like checkpoint (use_cache false in config.json, text_config, generation_config.json), "
        f"{args.images} images (64–81 image tokens), {args.new_tokens} new tokens each (forced), greedy, CPU "
        f"float32 + sdpa, {torch.get_num_threads()} threads; median of {args.runs} interleaved runs "
        f"(all runs: {'; '.join(f'{n} ' + ', '.join(f'{t:.2f}' for t in ts) for n, ts in times.items())} s).",
        "",
        "| scenario | time for all samples (s) | vlmfast speed-up |",
        "|---|---|---|",
    ]
    for name in scenarios:
        lines.append(f"| {name} | {med[name]:.2f} | {med[name] / med['vlmfast']:.1f}× |")
    lines += [
        "",
        f"`vlmfast --help` wall time: median {statistics.median(helps):.3f} s of 5 (target ≤ 0.5 s).",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if args.write:
        record(text, f"infer-tf{transformers.__version__.split('.')[0]}")


def record(section: str, key: str) -> None:
    """Replace (or append) the section between this key's markers in RESULTS.md."""
    path = HERE / "RESULTS.md"
    body = path.read_text() if path.exists() else "# vlmfast benchmark results\n\nWritten by the scripts in benchmarks/.\n"
    begin, end = f"<!-- {key}:begin -->", f"<!-- {key}:end -->"
    block = f"{begin}\n{section}{end}"
    if begin in body and end in body:
        body = body[: body.index(begin)] + block + body[body.index(end) + len(end):]
    else:
        body = body.rstrip("\n") + "\n\n" + block + "\n"
    path.write_text(body)


if __name__ == "__main__":
    main()
