"""A CPU decode step's matrix products, per call: plain ``linear`` (MKL), oneDNN's packed product and MKL's
packed product (both through vlmfast's ``Packed``, one row computed as two), side by side.

Shapes (out × in features): the tiny test checkpoints' Q/K/V (64-wide) and a 3B model's Q/K/V, O and gate/up
(2,048-wide); rows 1, 8 and 32 (a decode step's batch). Per shape and rows the three products run interleaved,
median of 7 runs of many calls each. Also whether a row's result is the same bits in every batch (rows 1 to
32, each row against itself alone). Run:
  .venv/bin/python benchmarks/bench_products.py --write
"""

from __future__ import annotations

import argparse
import statistics
import time

from bench_infer import record

SHAPES = {"tiny Q/K/V": (128, 64), "3B Q/K/V": (2560, 2048), "3B O": (2048, 2048), "3B gate/up": (22016, 2048)}
ROWS = (1, 8, 32)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()

    import torch
    from torch.nn import functional

    from vlmfast.engines.hf import fused

    lines = [
        f"### A CPU decode step's products, µs per call — torch {torch.__version__}, {torch.get_num_threads()} threads",
        "",
        f"Float32, interleaved, median of {args.runs} runs. Invariant: a row's result is the same bits alone and "
        "in batches of 2 to 32 rows.",
        "",
        "| shape (out × in) | rows | plain `linear` | oneDNN packed | MKL packed |",
        "|---|---|---|---|---|",
    ]
    with torch.inference_mode(False), torch.no_grad():
        g = torch.Generator().manual_seed(0)
        invariant = {}
        for name, (out_features, in_features) in SHAPES.items():
            weight, x = torch.randn(out_features, in_features, generator=g), torch.randn(32, in_features, generator=g)
            products = {"linear": lambda v, w=weight: functional.linear(v, w), "oneDNN": fused.Packed(weight, "oneDNN")}
            if fused.mkl_serves_any_rows():
                products["MKL"] = fused.Packed(weight, "MKL")
            for key, product in products.items():
                fn = product if key == "linear" else (lambda v, p=product: p(v, None))
                alone = [fn(x[row:row + 1]) for row in range(8)]
                invariant[key] = invariant.get(key, True) and all(
                    torch.equal(fn(x[:rows])[row:row + 1], alone[row]) for rows in (2, 3, 8, 13, 32) for row in range(8)
                    if row < rows)
            calls = max(5, int(2e8 / (out_features * in_features)))
            for rows in ROWS:
                times = {key: [] for key in products}
                for _ in range(args.runs + 1):
                    for key, product in products.items():
                        fn = product if key == "linear" else (lambda v, p=product: p(v, None))
                        v = x[:rows]
                        start = time.perf_counter()
                        for _ in range(calls):
                            fn(v)
                        times[key].append((time.perf_counter() - start) / calls * 1e6)
                med = {key: statistics.median(t[1:]) for key, t in times.items()}  # the first run warms up
                cells = [f"{med[k]:,.1f}" if k in med else "—" for k in ("linear", "oneDNN", "MKL")]
                lines.append(f"| {name} {out_features} × {in_features} | {rows} | " + " | ".join(cells) + " |")
    lines.append("| invariant (every shape) | | " + " | ".join(
        ("yes" if invariant[k] else "no") if k in invariant else "—" for k in ("linear", "oneDNN", "MKL")) + " |")
    text = "\n".join(lines + [""])
    print(text)
    if args.write:
        record(text, "products-cpu")


if __name__ == "__main__":
    main()
