"""Turn what benchmarks/gpu.sh measured into the GPU section of benchmarks/RESULTS.md.

  python benchmarks/gpu_table.py NAME/MODE=BENCH_REPORT_DIR ... NAME/infer=FIRST.json,SECOND.json [--write]

One row per checkpoint, mode and batch size: tokens/s, TTFT, decode ms per step, achieved decode
bandwidth and its share of the device's peak; then, per checkpoint, what a first and a second compiled
run spent compiling and capturing (the second finds the kernels in vlmfast's compile cache).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench_infer import record


def table(benches: dict[str, dict], infers: dict[str, tuple[dict, dict]]) -> str:
    first = next(iter(benches.values()))
    w, v = first["workload"], first["versions"]
    lines = [
        f"### GPU — transformers {v['transformers']}, torch {v['torch']}",
        "",
        f"{w['samples']} images (448 px), {w['max_new_tokens']} new tokens forced, {w['warmup']} warm-up + "
        f"{w['repeats']} timed runs per row; medians. Written by benchmarks/gpu.sh.",
        "",
        "| checkpoint | mode | batch | tokens/s | TTFT p50 ms | decode ms/step | decode GB/s | % of peak |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for key, report in benches.items():
        name, mode = key.split("/", 1)
        for s in report["scenarios"]:
            cells = [name, mode, str(s["batch_size"])] + [
                "–" if s.get(k) is None else f"{s[k]:.{d}f}"
                for k, d in (("tokens_per_s", 1), ("ttft_ms_p50", 1), ("decode_ms_per_token", 2),
                             ("decode_gb_per_s", 0), ("bandwidth_pct_of_peak", 1))
            ]
            lines.append("| " + " | ".join(cells) + " |")
    if infers:
        lines += ["", "| checkpoint | compile + capture, first run (s) | second run (s) | cache | tokens/s (2nd) |",
                  "|---|---|---|---|---|"]
        for name, (a, b) in infers.items():
            cache = ",".join(c["cache"] for c in (b.get("compile_cache") or {}).get("compiles", [])) or "–"
            lines.append(f"| {name} | {a.get('compile_s') or 0:.1f} | {b.get('compile_s') or 0:.1f} | {cache} | "
                         f"{b.get('tokens_per_s') or 0:.1f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("reports", nargs="+", help="NAME/MODE=REPORT_DIR or NAME/infer=FIRST.json,SECOND.json")
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    benches, infers = {}, {}
    for item in args.reports:
        key, _, where = item.partition("=")
        if key.endswith("/infer"):
            a, b = (json.loads(Path(p).read_text()) for p in where.split(","))
            infers[key.split("/")[0]] = (a, b)
        else:
            benches[key] = json.loads((Path(where) / "report.json").read_text())
    text = table(benches, infers)
    print(text)
    if args.write:
        record(text, "gpu")


if __name__ == "__main__":
    main()
