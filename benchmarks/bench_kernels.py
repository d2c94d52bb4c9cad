"""The compiled decode step, counted: graph breaks and kernels per decoder layer, for every family.

For each family's demo-size random-weight checkpoint (the real model class), the static decode step as
vlmfast runs it (decode attention, fused Q/K/V and gate/up) is traced by dynamo (graph breaks) and
compiled by inductor afresh (no cache); the kernel calls in inductor's code are counted with one
period of layers and with two (Qwen3.5: three linear-attention layers and one full one), and their
difference is what one layer adds: *generated* kernels (inductor's own: C++ on a CPU, Triton on a GPU)
and *library* calls (matrix products, attention). On a CPU the generated count is a proxy of a GPU's.
  .venv/bin/python benchmarks/bench_kernels.py --write
On a GPU, the 3B shape (benchmarks/gpu.sh runs it):
  python benchmarks/bench_kernels.py --ckpt CKPT --families qwen2_5_vl --device cuda --dtype bfloat16 --json OUT
"""

from __future__ import annotations

import argparse
import atexit
import json
import shutil
import tempfile
import time
from pathlib import Path

from bench_infer import record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", default="", help="comma-separated family keys (default: every one this transformers has)")
    parser.add_argument("--ckpt", help="an existing checkpoint (one family) instead of building demo-size ones")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--json", help="also write the figures as JSON here")
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()

    import torch
    import transformers

    from vlmfast.checkpoints.families import BY_KEY
    from vlmfast.checkpoints.load import load
    from vlmfast.checkpoints.tiny import build_checkpoint
    from vlmfast.engines.hf.step_kernels import per_layer

    keys = [k for k in (args.families.split(",") if args.families else BY_KEY) if hasattr(transformers, BY_KEY[k].model_class)]
    work = Path(tempfile.mkdtemp(prefix="vlmfast-bench-kernels-"))
    atexit.register(shutil.rmtree, work, True)  # what the run made goes with it
    rows, figures = [], {}
    for key in keys:
        # the demo shapes: Qwen3.5's tiny model has one period of layers only (per-layer counts need two)
        ckpt = args.ckpt or str(build_checkpoint(work / key, family=key, preset="demo"))
        model = load(ckpt, device=args.device, dtype=args.dtype).model
        period = 4 if key.startswith("qwen3_5") else 1  # Qwen3.5: three linear-attention layers, one full
        start = time.perf_counter()
        counted = per_layer(model, key, period=period)
        seconds = time.perf_counter() - start
        print(counted.line(), f"({seconds:.0f} s)", flush=True)
        rows.append(f"| {BY_KEY[key].name} | {counted.graph_breaks} | {counted.generated:g} | {counted.library:g} | "
                    f"{counted.generated + counted.library:g} |")
        figures[key] = {"graph_breaks": counted.graph_breaks, "generated_per_layer": counted.generated,
                        "library_per_layer": counted.library}
        del model
    text = "\n".join([
        f"### The compiled decode step: graph breaks and kernels per layer — transformers {transformers.__version__}, "
        f"torch {torch.__version__}",
        "",
        f"Each family's {'checkpoint ' + args.ckpt if args.ckpt else 'demo-size random-weight checkpoint'} on {args.device}"
        f" ({args.dtype or 'float32'}), the static decode step of 4 rows × 256 keys as vlmfast runs it (decode "
        "attention; Q/K/V, gate/up, Gated DeltaNet inputs and the MoE shared expert fused; routed experts' offsets by "
        "one search; the token choice included), compiled by inductor without a cache; "
        "kernel calls in its code, "
        "what one decoder layer adds (Qwen3.5: a period of 4 layers, divided by 4). Target: 0 graph breaks, "
        "≤ 8 generated kernels per layer.",
        "",
        "| family | graph breaks | generated kernels / layer | library calls / layer | all / layer |",
        "|---|---|---|---|---|",
        *rows,
        "",
    ])
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps({"device": args.device, "families": figures}, indent=1))
    if args.write:
        record(text, f"kernels-{args.device}")


if __name__ == "__main__":
    main()
