"""The decode step's attention alone, by the ways a GPU could run it, side by side: SDPA (what uncompiled
static steps call) against the candidates, two matrix products among them (what a compiled step calls on
CUDA since this benchmark measured it faster there), on the 3B shape's heads (16 query heads, 2 key/value
heads, 128 dims).

On an H200 the compiled decode step spent 0.50 ms of its 3.4 ms at batch 1 in cuDNN's attention (13.8 µs per
layer for one new token: a prefill kernel with 64 × 128 tiles; benchmarks/RESULTS.md). Each way here takes
the same inputs — a new token per row against a static cache whose rows are filled to different lengths,
left padding masked — and is timed as the compiled step runs it: compiled, replayed from a CUDA graph.

  python benchmarks/bench_decode_attention.py [--device cuda] [--batches 1,32] [--keys 512,1024] [--ways ...]
      [--modes compiled,graphs] [--json FILE]

Ways (--ways): ``sdpa`` (engines/hf/text_decoder.decode_attention with the additive mask a static step
passes: the backend SDPA picks), ``products`` (text_decoder.products_decode_attention: two batched matrix
products around a float32 softmax), ``sdpa-efficient`` (SDPA held to the memory-efficient kernel), ``flex``
(torch's FlexAttention, its decoding kernel for short queries, the mask as a score modification; compiled
only). Modes (--modes): ``compiled`` as a compiled step runs it, ``graphs`` uncompiled as the default
CUDA-graph step runs it. Each output's largest difference from the first way's is reported. On an H100
(vlmfast 0.14, one call), compiled: sdpa 16.4 µs at batch 1 and 512 keys, sdpa-efficient 23.4, flex 31.8;
another call: sdpa 15.2, products 6.7 (scores then rounded to bf16). On a CPU it runs as a check of the
script (no graphs; its figures are not the point).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics

Q_HEADS, KV_HEADS, DIM = 16, 2, 128  # Qwen2.5-VL-3B's language model


def ways(device: str):
    """name → attention(query, key, value, mask, valid): query (B, 16, 1, 128), key/value (B, 2, S, 128), the
    additive mask a static step passes (B, 1, 1, S) in the model's dtype, and the same as a bool (B, S)."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from vlmfast.engines.hf.text_decoder import decode_attention, products_decode_attention

    def sdpa(q, k, v, mask, valid):
        return decode_attention(None, q, k, v, mask, scaling=DIM ** -0.5)[0]

    def products(q, k, v, mask, valid):
        return products_decode_attention(None, q, k, v, mask, scaling=DIM ** -0.5)[0]

    def efficient(q, k, v, mask, valid):
        with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):
            return sdpa(q, k, v, mask, valid)

    def flex(q, k, v, mask, valid):
        from torch.nn.attention.flex_attention import flex_attention

        def masked(score, b, h, q_idx, kv_idx):
            return torch.where(valid[b, kv_idx], score, -float("inf"))

        out = flex_attention(q, k, v, score_mod=masked, scale=DIM ** -0.5, enable_gqa=True)
        return out.transpose(1, 2).contiguous()

    found = {"sdpa": sdpa, "products": products, "sdpa-efficient": efficient, "flex": flex}
    if not device.startswith("cuda"):
        found.pop("sdpa-efficient")  # a CUDA kernel
    return found


def measure(fn, inputs, device: str, iters: int, runs: int, compile: bool) -> list[float]:
    """µs per call: compiled or as is; on CUDA replayed from a graph of ``iters`` calls; ``runs`` timings."""
    import torch

    from vlmfast.timing import now

    compiled = torch.compile(fn, dynamic=False) if compile else fn
    for _ in range(3):
        compiled(*inputs)  # compile, warm
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(iters):
                compiled(*inputs)
        step = graph.replay
    else:
        def step():
            for _ in range(iters):
                compiled(*inputs)
    step()
    times = []
    for _ in range(runs):
        start = now(device)
        step()
        times.append((now(device) - start) / iters * 1e6)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--batches", default="1,32")
    parser.add_argument("--keys", default="512,1024")
    parser.add_argument("--ways", default="sdpa,products", help="of: sdpa, products, sdpa-efficient, flex")
    parser.add_argument("--modes", default="compiled,graphs",
                        help="compiled (as a compiled step), graphs (uncompiled, as the default CUDA-graph step)")
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--json")
    args = parser.parse_args()

    import torch

    on_cuda = args.device.startswith("cuda")
    dtype = torch.bfloat16 if on_cuda else torch.float32
    results = []
    with torch.inference_mode():
        for batch in (int(b) for b in args.batches.split(",")):
            for keys in (int(s) for s in args.keys.split(",")):
                g = torch.Generator(device=args.device).manual_seed(0)
                q = torch.randn(batch, Q_HEADS, 1, DIM, device=args.device, dtype=dtype, generator=g)
                k, v = (torch.randn(batch, KV_HEADS, keys, DIM, device=args.device, dtype=dtype, generator=g) for _ in range(2))
                # rows filled to different lengths, each left-padded by a few keys: what a batch's cache holds
                filled = torch.linspace(keys // 4, keys, batch, device=args.device).long()
                pad = torch.arange(batch, device=args.device) % 7
                index = torch.arange(keys, device=args.device)
                valid = (index >= pad[:, None]) & (index < filled[:, None])
                mask = torch.zeros(valid.shape, dtype=dtype, device=args.device).masked_fill_(~valid, torch.finfo(dtype).min)
                inputs = (q, k, v, mask[:, None, None, :], valid)
                reference = None
                found = ways(args.device)
                for name in args.ways.split(","):
                    for mode in args.modes.split(","):
                        if mode == "graphs" and name == "flex":
                            continue  # FlexAttention runs compiled only
                        fn = found[name]
                        try:
                            out = (torch.compile(fn, dynamic=False) if mode == "compiled" else fn)(*inputs)
                            if reference is None:
                                reference = out
                            error = (out.float() - reference.float()).abs().max().item()
                            times = measure(fn, inputs, args.device, args.iters if on_cuda else 5,
                                            args.runs if on_cuda else 2, mode == "compiled")
                            row = {"batch": batch, "keys": keys, "way": f"{name} ({mode})",
                                   "us_p50": round(statistics.median(times), 2), "us_runs": [round(t, 2) for t in times],
                                   "max_abs_diff": error}
                        except Exception as exc:  # a way this torch cannot run: said, the others go on
                            row = {"batch": batch, "keys": keys, "way": f"{name} ({mode})",
                                   "error": f"{type(exc).__name__}: {str(exc)[:200]}"}
                        results.append(row)
                        print(json.dumps(row), flush=True)
    report = {"device": torch.cuda.get_device_name(0) if on_cuda else "cpu", "torch": torch.__version__,
              "dtype": str(dtype).removeprefix("torch."), "results": results}
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
