"""The Qwen2.5-VL vision tower with transformers' per-window attention calls vs vlmfast's merged ones
(src/vlmfast/engines/hf/vision_attention.py), and merged with the patch embedding as one matrix product
(src/vlmfast/engines/hf/patch_embed.py: what prefill runs), side by side.

  python benchmarks/bench_vision.py [--preset demo|3b] [--device cpu|cuda] [--dtype float32|bfloat16]
                                    [--runs 7] [--json FILE]

The tower of a vlmfast.checkpoints.tiny preset (3b: the real Qwen2.5-VL-3B/7B vision config) with random weights,
sdpa, on 8 images' worth of patches: "mixed" 224–644 px (8,052 patches), "same" 8 × 448 px (8,192).
Per workload: one warm-up, then the three ways interleaved `--runs` times (device-synchronized clocks);
medians, every run, and scaled_dot_product_attention calls per forward.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

WORKLOADS = {"mixed": [16, 20, 24, 28, 32, 36, 40, 46], "same": [32] * 8}  # image sides in 14-px patches


def build_tower(preset: str, device: str, dtype: str):
    import torch
    from transformers import Qwen2_5_VLConfig
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel

    from vlmfast.checkpoints.tiny import PRESETS

    spec = PRESETS[preset]
    vision = dict(spec["vision"], in_channels=3, patch_size=14, spatial_merge_size=2, temporal_patch_size=2,
                  window_size=112, hidden_act="silu", out_hidden_size=spec["text"]["hidden_size"])
    config = Qwen2_5_VLConfig(vision_config=vision).vision_config
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device(device):  # random weights made where they run: seconds for the 3B tower on a GPU
        return Qwen2_5_VisionTransformerPretrainedModel._from_config(config).to(getattr(torch, dtype)).eval()


def measure(tower, sides: list[int], runs: int) -> dict:
    import torch

    import contextlib

    from vlmfast.engines.hf.patch_embed import use_linear_patch_embed
    from vlmfast.engines.hf.vision_attention import use_merged_vision_attention
    from vlmfast.timing import now

    device = str(next(tower.parameters()).device)
    grid = torch.tensor([[1, s, s] for s in sides], device=device)
    config = tower.config
    pixels = torch.randn(int(grid.prod(-1).sum()), config.in_channels * config.temporal_patch_size * config.patch_size ** 2,
                         device=device, dtype=next(tower.parameters()).dtype)
    calls = [0]
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def counted(*args, **kwargs):
        calls[0] += 1
        return sdpa(*args, **kwargs)

    def forward(way: str) -> tuple[float, int]:
        calls[0] = 0
        start = now(device)
        with contextlib.ExitStack() as stack:
            stack.enter_context(torch.inference_mode())
            if way != "per-window":
                stack.enter_context(use_merged_vision_attention(tower))
            if way == "merged+product":
                stack.enter_context(use_linear_patch_embed(tower))
            tower(pixels, grid_thw=grid)
        return now(device) - start, calls[0]

    torch.nn.functional.scaled_dot_product_attention = counted
    try:
        counts = {way: forward(way)[1] for way in ("per-window", "merged", "merged+product")}  # the warm-up
        times = {way: [] for way in counts}
        for _ in range(runs):
            for way in times:
                times[way].append(forward(way)[0] * 1000)
    finally:
        torch.nn.functional.scaled_dot_product_attention = sdpa
    return {"patches": int(pixels.shape[0]), "sdpa_calls": counts,
            "ms_runs": {w: [round(t, 1) for t in v] for w, v in times.items()},
            "ms_median": {w: round(statistics.median(v), 1) for w, v in times.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="demo")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    import torch
    import transformers

    tower = build_tower(args.preset, args.device, args.dtype)
    name = torch.cuda.get_device_name(0) if args.device.startswith("cuda") else f"CPU, {torch.get_num_threads()} threads"
    figures = {"preset": args.preset, "device": name, "dtype": args.dtype, "transformers": transformers.__version__,
               "torch": torch.__version__, "workloads": {w: measure(tower, sides, args.runs) for w, sides in WORKLOADS.items()}}
    for workload, f in figures["workloads"].items():
        ratio = f["ms_median"]["per-window"] / f["ms_median"]["merged"]
        print(f"{workload:5s} {f['patches']} patches: per-window {f['ms_median']['per-window']} ms "
              f"({f['sdpa_calls']['per-window']} SDPA calls) vs merged {f['ms_median']['merged']} ms "
              f"({f['sdpa_calls']['merged']} calls): {ratio:.2f}×; with the patch product "
              f"{f['ms_median']['merged+product']} ms; runs {f['ms_runs']}", file=sys.stderr)
    if args.json:  # whole or not at all: a step of benchmarks/gpu.sh counts as done when the file is there
        Path(args.json + ".part").write_text(json.dumps(figures, indent=1) + "\n")
        os.replace(args.json + ".part", args.json)


if __name__ == "__main__":
    main()
