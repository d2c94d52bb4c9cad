"""Where the time to the first token goes on a CUDA device: one prefill of --batch images (vision tower,
language model) timed part by part, then the same prefill under torch's profiler: the device time its
kernels add up to against its wall time (the rest is the host: Python, launches, read-backs), and the
kernels and host operations that cost most. The rotary index (the prompts' 3-D positions) is made when
the inputs are, off the prefill: its time is reported beside it.

The checkpoint is loaded as `infer` loads it (bfloat16, sdpa unless flash-attn is there); the prefill is
the engine's own (merged vision attention, the patch embedding as one product); with --compile, its
vision blocks compiled as `--compile` runs them (the compile's seconds reported apart). Made for a CUDA
device (on a CPU it runs, as a check of the script).
Run:
  python benchmarks/profile_prefill.py CKPT IMAGES_DIR [--batch 32] [--compile] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics


def _top(events, key, n=12):
    by_name: dict[str, list[float]] = {}
    for e in events:
        by_name.setdefault(e.name, []).append(key(e))
    top = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:n]
    return [{"name": name[:90], "calls": len(v), "ms": round(sum(v) / 1000, 3)} for name, v in top]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("ckpt")
    parser.add_argument("images")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--compile", action="store_true", help="the vision blocks compiled (CUDA), as --compile runs them")
    parser.add_argument("--json")
    args = parser.parse_args()

    import torch
    from torch.profiler import ProfilerActivity, profile

    from vlmfast.checkpoints.load import detect_runtime, load
    from vlmfast.engines.hf import text_decoder
    from vlmfast.engines.hf.engine import Engine, GenerationSettings
    from vlmfast.inputs.requests import Request
    from vlmfast.timing import now

    runtime = detect_runtime()
    device = runtime.device  # a CPU runs it too (a check of the script; its figures are not the point)
    loaded = load(args.ckpt, device=device, dtype=runtime.dtype, attn=runtime.attn)
    engine = Engine(loaded, GenerationSettings(max_new_tokens=2, ignore_eos=True), compile=args.compile)
    images = sorted(pathlib.Path(args.images).glob("*.png"))[:args.batch]
    prepared = engine.prepare([Request(str(p), (str(p),), "Describe this image.") for p in images])
    rope_s = []
    for _ in range(args.runs):  # as a prefetch worker makes them: on the CPU's tensors
        start = now("cpu")
        with torch.inference_mode():
            for g in prepared.groups:
                text_decoder.rope_positions(loaded.model, g.inputs)
        rope_s.append(now("cpu") - start)
    compile_s = 0.0

    def prefill():
        nonlocal compile_s
        start = now(device)
        prefilled = engine.prefill(prepared)
        compile_s += prefilled.compile_s
        return now(device) - start - prefilled.compile_s, prefilled.vision_s or 0.0

    for _ in range(2):  # warm: cuDNN/cuBLAS choose their kernels on a shape's first call (and it compiles)
        prefill()
    timed = [prefill() for _ in range(args.runs)]
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])
    with profile(activities=activities) as prof:
        profiled_s, _ = prefill()
    wall, vision = ([t[k] for t in timed] for k in range(2))
    events = prof.events()
    kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
    host_ops = [e for e in events if e.device_type == torch.autograd.DeviceType.CPU and e.name.startswith("aten::")]
    kernel_ms = sum(e.time_range.elapsed_us() for e in kernels) / 1000
    groups = prepared.groups
    result = {
        "gpu": torch.cuda.get_device_name(0) if device.startswith("cuda") else "cpu", "attn": runtime.attn, "images": len(images),
        "prefill_groups": [g.end - g.start for g in groups],
        "prompt_tokens": [int(g.inputs["input_ids"].numel()) for g in groups],
        "wall_ms": round(statistics.median(wall) * 1000, 1),
        "vision_ms": round(statistics.median(vision) * 1000, 1),
        "rope_index_ms": round(statistics.median(rope_s) * 1000, 1),  # with the inputs, off the prefill
        "language_ms": round((statistics.median(wall) - statistics.median(vision)) * 1000, 1),
        "compiled_vision": bool(args.compile and engine.policy.enabled and engine.compile_vision),
        "compile_s": round(compile_s, 1),
        "profiled_wall_ms": round(profiled_s * 1000, 1), "kernel_ms": round(kernel_ms, 1), "kernels": len(kernels),
        "top_kernels": _top(kernels, lambda e: e.time_range.elapsed_us()),
        "top_host_ops": _top(host_ops, lambda e: e.self_cpu_time_total),
    }
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(result, indent=1))
    print(f"{result['images']} images in groups {result['prefill_groups']} ({result['prompt_tokens']} prompt tokens)"
          f"{', vision blocks compiled (' + str(result['compile_s']) + ' s to compile)' if result['compiled_vision'] else ''}: "
          f"{result['wall_ms']} ms = vision {result['vision_ms']} + language model {result['language_ms']} "
          f"(the rotary index, made with the inputs: {result['rope_index_ms']} ms); under the profiler "
          f"{result['profiled_wall_ms']} ms wall, {result['kernel_ms']} ms in {result['kernels']} kernels")
    for title, rows in (("kernels", result["top_kernels"]), ("host operations (self time)", result["top_host_ops"])):
        print(title)
        for r in rows:
            print(f"  {r['ms']:9.3f} ms  {r['calls']:6d}x  {r['name']}")


if __name__ == "__main__":
    main()
