"""Turn `vlmfast bench --report` directories into the GPU section of benchmarks/RESULTS.md.

  python benchmarks/gpu_table.py eager=DIR compile=DIR [--write]

One row per mode, scenario and batch size: tokens/s, TTFT, decode ms/token, achieved decode bandwidth
and its share of the device's peak (the issue #6 target: ≥ 70% at batch 1 with --compile).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench_infer import record


def table(reports: dict[str, dict]) -> str:
    first = next(iter(reports.values()))
    w, v = first["workload"], first["versions"]
    lines = [
        f"### GPU: {first['checkpoint']} — transformers {v['transformers']}, torch {v['torch']}",
        "",
        f"{w['samples']} synthetic images, {w['max_new_tokens']} new tokens (ignore_eos={w['ignore_eos']}), "
        f"{w['warmup']} warm-up + {w['repeats']} timed runs per row; medians.",
        "",
        "| mode | scenario | batch | tokens/s | TTFT p50 ms | decode ms/token | decode GB/s | % of peak |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for mode, report in reports.items():
        for s in report["scenarios"]:
            cells = [mode, s["name"], str(s["batch_size"])] + [
                "–" if s.get(k) is None else f"{s[k]:.{d}f}"
                for k, d in (("tokens_per_s", 1), ("ttft_ms_p50", 1), ("decode_ms_per_token", 2),
                             ("decode_gb_per_s", 0), ("bandwidth_pct_of_peak", 1))
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("reports", nargs="+", help="MODE=REPORT_DIR")
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    reports = {}
    for item in args.reports:
        mode, _, directory = item.partition("=")
        reports[mode] = json.loads((Path(directory) / "report.json").read_text())
    text = table(reports)
    print(text)
    if args.write:
        record(text, "gpu")


if __name__ == "__main__":
    main()
