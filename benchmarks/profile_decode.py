"""Where a decode step's time goes on a CUDA device: kernels per step, their summed device time against
the step's wall time (a gap is host or launch time), and the kernels that cost most.

The checkpoint is loaded as `infer` loads it (bfloat16, sdpa unless flash-attn is there), one batch of
--batch images runs through the engine (capturing its CUDA graphs), then the same decode state steps
--steps more times under the profiler replaying the captured graphs (--uncaptured: also running the same
static step kernel by kernel from Python); with --compile, the compiled step (as `--compile` runs it). With
--attention sdpa,products each static-step attention is profiled in turn on the one loaded model. Needs a
CUDA device.
Run:
  python benchmarks/profile_decode.py CKPT IMAGES_DIR [--batch 1] [--compile] [--attention sdpa,products]
      [--uncaptured] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics


def _profile(state, steps: int):
    import torch
    from torch.profiler import ProfilerActivity, profile

    def reset():
        state.rewind()

    reset()
    for _ in range(8):  # warm: the first launches of an uncaptured step load kernels
        state.step()
    reset()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        start.record()
        for _ in range(steps):
            state.step()
        end.record()
        torch.cuda.synchronize()
    wall_ms = start.elapsed_time(end) / steps
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    by_name: dict[str, list[float]] = {}
    for e in kernels:
        by_name.setdefault(e.name, []).append(e.time_range.elapsed_us() / 1000)  # µs → ms
    device_ms = sum(sum(v) for v in by_name.values()) / steps
    top = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:15]
    return {"wall_ms_per_step": round(wall_ms, 3), "kernel_ms_per_step": round(device_ms, 3),
            "kernels_per_step": round(len(kernels) / steps, 1),
            "top": [{"kernel": name[:90], "per_step": round(len(v) / steps, 1), "ms_per_step": round(sum(v) / steps, 4),
                     "median_us": round(statistics.median(v) * 1000, 1)} for name, v in top]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("ckpt")
    parser.add_argument("images")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--steps", type=int, default=48)
    parser.add_argument("--compile", action="store_true", help="the compiled decode step")
    parser.add_argument("--attention", default="",
                        help="the static step's attention, one or more (sdpa, products): each profiled in turn "
                             "(default: the step's own, products compiled on CUDA, sdpa otherwise)")
    parser.add_argument("--uncaptured", action="store_true", help="also the step launched kernel by kernel")
    parser.add_argument("--json")
    args = parser.parse_args()

    import torch

    from vlmfast.checkpoints.load import detect_runtime, load
    from vlmfast.engines.hf.engine import Engine, GenerationSettings
    from vlmfast.engines.hf.scheduler import Scheduler
    from vlmfast.engines.hf.text_decoder import PRODUCTS_DECODE_ATTENTION
    from vlmfast.inputs.requests import Request

    runtime = detect_runtime()
    loaded = load(args.ckpt, device="cuda", dtype=runtime.dtype, attn=runtime.attn)
    images = sorted(pathlib.Path(args.images).glob("*.png"))[:args.batch]
    reqs = [Request(str(p), (str(p),), "Describe this image.") for p in images]
    text_bytes = sum(p.numel() * p.element_size() for n, p in loaded.model.named_parameters() if "visual" not in n)
    result = {"gpu": torch.cuda.get_device_name(0), "batch": args.batch, "attn": runtime.attn,
              "text_weight_gb": round(text_bytes / 1e9, 3)}
    for attention in args.attention.split(",") if args.attention else [""]:  # one load, a step per attention
        if attention:
            os.environ["VLMFAST_DECODE_ATTENTION"] = attention
        else:
            os.environ.pop("VLMFAST_DECODE_ATTENTION", None)
        engine = Engine(loaded, GenerationSettings(max_new_tokens=128, ignore_eos=True), compile=args.compile)
        with torch.inference_mode():
            list(Scheduler(engine).run(reqs, {}, args.batch))
            state = next(iter(engine._static.values()))
            ways = {"graphs": _profile(state, args.steps)}
            if args.uncaptured:
                graphs, state.graphs = state.graphs, {}
                try:
                    ways["uncaptured"] = _profile(state, args.steps)
                finally:
                    state.graphs = graphs
        engine.forget_shapes()
        used = "products" if state.attention == PRODUCTS_DECODE_ATTENTION else "sdpa"
        prefix = "" if attention in ("", "sdpa") else f"{attention}-"
        result.update({f"{prefix}{way}": r for way, r in ways.items()}, compiled=engine.policy.enabled)
        result[f"{prefix}attention"] = used
        for way, r in ways.items():
            print(f"{used} {way}: {r['wall_ms_per_step']} ms/step wall, {r['kernel_ms_per_step']} ms of kernels, "
                  f"{r['kernels_per_step']} kernels/step ({result['text_weight_gb']} GB of text weights)")
            for k in r["top"]:
                print(f"  {k['ms_per_step']:8.4f} ms  {k['per_step']:5.1f}x  {k['median_us']:7.1f} us  {k['kernel']}")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(result, indent=1))

if __name__ == "__main__":
    main()
