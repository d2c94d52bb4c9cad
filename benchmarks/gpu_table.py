"""Turn every report benchmarks/gpu.sh left in its output directory into one table: the GPU section of
benchmarks/RESULTS.md.

  python benchmarks/gpu_table.py OUT_DIR [--write]

Reads OUT_DIR/reports/*/report.json (``vlmfast bench --report``), OUT_DIR/reports/*/first.json and
second.json (``vlmfast infer --json``, a compiled run and the run after it), OUT_DIR/reports/vision.json
(benchmarks/bench_vision.py) and OUT_DIR/device.json.
Prints the table, writes it to OUT_DIR/table.md and, with --write, into RESULTS.md. Reports from
earlier slices count as much as this one's: the table is rebuilt from all of them every time.

One row per checkpoint, mode and batch size: samples, tokens/s, TTFT, decode ms per step, achieved
decode bandwidth and its share of the device's peak; then, per checkpoint, what a first and a second
compiled run spent compiling and capturing (the second finds the kernels in vlmfast's compile cache).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

MODES = ("default", "compile", "hf")  # vlmfast's CUDA graphs, + torch.compile, plain generate
# a step gpu.sh runs with VLMFAST_DECODE_ATTENTION=sdpa (or =products) reports into a *-sdpa-* (*-products-*)
# directory: the row's mode says so (a report itself does not say which attention its static steps ran)
ATTENTION = {"-sdpa-": ", SDPA attention", "-products-": ", products attention"}
FIGURES = (("tokens_per_s", 1), ("ttft_ms_p50", 1), ("decode_ms_per_token", 2), ("decode_gb_per_s", 0),
           ("bandwidth_pct_of_peak", 1))


def mode_of(report: dict, where: str = "") -> str:
    """The row's mode: from the report's workload, and from ``where``, the name of its directory."""
    workload = report["workload"]
    if workload.get("decoder") == "hf":
        return "hf"
    if not workload.get("compile"):
        mode = "default"
    else:
        # a compile that failed ran the uncompiled step: its figures are not "compile" figures
        ran = [s.get("compiled") for s in report.get("scenarios", []) if s.get("name") != "ckpt-vllm"]
        mode = "compile" if all(c is not False for c in ran) else "compile failed (uncompiled)"
    return mode + next((label for part, label in ATTENTION.items() if part in where), "")


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:  # a report cut short by a killed step: said, and left out
        print(f"gpu_table: skipping {path}: {exc}", file=sys.stderr)
        return None


def collect(out: Path) -> tuple[list[dict], dict[str, tuple[dict, dict]]]:
    """Every finished bench report, and per checkpoint its (first, second) compiled infer reports."""
    reports = out / "reports"
    benches = [{**r, "report_dir": p.parent.name} for p in sorted(reports.glob("*/report.json"))
               if (r := _read(p)) is not None]
    infers = {}
    for first in sorted(reports.glob("*/first.json")):
        second = first.with_name("second.json")
        a, b = _read(first), _read(second) if second.exists() else None
        if a is not None and b is not None:
            infers[Path(a["checkpoint"]).name] = (a, b)
    return benches, infers


def rows(benches: list[dict]) -> list[list[str]]:
    """Table cells of every vlmfast scenario, by checkpoint, mode (MODES order) and batch size."""
    found = []
    for report in benches:
        name, samples = Path(report["checkpoint"]).name, report["workload"]["samples"]
        mode = mode_of(report, report.get("report_dir", ""))
        for s in report["scenarios"]:
            if s["name"] != "ckpt":
                continue
            cells = ["–" if s.get(k) is None else f"{s[k]:.{d}f}" for k, d in FIGURES]
            vision, language = s.get("ttft_vision_ms_p50"), s.get("ttft_language_ms_p50")  # (reports since 0.12)
            cells.append("–" if vision is None or language is None else f"{vision:.1f} / {language:.1f}")
            plain = mode.split(", ")[0]
            order = (MODES.index(plain) if plain in MODES else len(MODES), plain != mode)  # the default attention first
            found.append(((name, order, s["batch_size"]), [name, mode, str(s["batch_size"]), str(samples), *cells]))
    return [cells for _, cells in sorted(found)]


def vision_lines(vision: dict) -> list[str]:
    """benchmarks/bench_vision.py's figures: the vision tower per window vs merged (and merged with the patch
    embedding as a product, where the figures have it)."""
    lines = ["", f"Vision tower ({vision['preset']} config, {vision['dtype']}, random weights), 8 images per forward; "
             "medians (benchmarks/bench_vision.py):", "",
             "| images | patches | per-window ms | SDPA calls | merged ms | SDPA calls | speed-up | + patch product ms | speed-up |",
             "|---|---|---|---|---|---|---|---|---|"]
    for workload, f in vision["workloads"].items():
        ms, calls = f["ms_median"], f["sdpa_calls"]
        product = ms.get("merged+product")
        tail = f"{product:.1f} | {ms['per-window'] / product:.2f}× |" if product else "– | – |"
        lines.append(f"| {workload} | {f['patches']} | {ms['per-window']:.1f} | {calls['per-window']} | {ms['merged']:.1f} | "
                     f"{calls['merged']} | {ms['per-window'] / ms['merged']:.2f}× | {tail}")
    return lines


def run_lines(runs: list[tuple[dict, dict]]) -> list[str]:
    """gpu.sh's whole-run steps: (wall.json, the sweep's --json report) each."""
    lines = ["", "Whole runs judged end to end: one `vlmfast sweep` over every checkpoint (swaps included), forced tokens:", "",
             "| shape | checkpoints | prompts × tokens | wall min | sustained tokens/s | swap s (median, max) | "
             "tokens/s per checkpoint (median) |", "|---|---|---|---|---|---|---|"]
    for wall, report in runs:
        figures = report["checkpoints"]
        swaps = sorted(f["swap_s"] for f in figures if f.get("swap_s") is not None)
        rates = sorted(f["tokens_per_s"] for f in figures if f.get("tokens_per_s"))
        tokens = wall["checkpoints"] * wall["prompts"] * wall["tokens"]
        swap = f"{swaps[len(swaps) // 2]:.2f}, {swaps[-1]:.2f}" if swaps else "–"
        rate = f"{rates[len(rates) // 2]:.0f}" if rates else "–"
        lines.append(f"| {wall['size']} | {wall['checkpoints']} | {wall['prompts']} × {wall['tokens']} | "
                     f"{wall['wall_s'] / 60:.1f} | {tokens / wall['wall_s']:.0f} | {swap} | {rate} |")
    return lines


def length_lines(mixes: dict[str, dict]) -> list[str]:
    """gpu.sh's real-length steps (benchmarks/bench_lengths.py --json): static batches vs continuous batching
    (with the device's admission policy, and with 0.10's where the step ran it), a row per mode."""
    lines = ["", "Answers of real lengths (8 images × 4 draws × 8 sampled answers up to 512 tokens, 32 decode rows; "
             "benchmarks/bench_lengths.py):", "",
             "| checkpoint | mode | useful tokens/s | ÷ static batches | decode row utilization | prefills, their s, "
             "decode steps |", "|---|---|---|---|---|---|"]
    for name, mix in sorted(mixes.items()):
        rate, modes = mix["useful_tokens_per_s"], mix.get("modes", {})  # (reports before 0.11 have no "modes")
        static = rate.get("static batches")
        for mode, tokens_per_s in rate.items():
            m = modes.get(mode, {})
            ratio = f"{tokens_per_s / static:.2f}×" if static and mode != "static batches" else "–"
            use = f"{m['answer_tokens'] / m['row_steps']:.0%}" if m.get("row_steps") else "–"
            where = f"{m['prefills']}, {m['prefill_s']:.2f} s, {m['decode_steps']:,}" if "prefills" in m else "–"
            lines.append(f"| {name} | {mode} | {tokens_per_s:,.0f} | {ratio} | {use} | {where} |")
    return lines


def prefill_lines(prefills: dict[str, dict]) -> list[str]:
    """gpu.sh's prefill profiles (benchmarks/profile_prefill.py --json): the time to the first token, part by
    part, its kernels' device time against its wall time, and the kernels that cost most."""
    lines = ["", "Where the time to the first token goes (benchmarks/profile_prefill.py: one prefill, median of 5; "
             "kernel time from one more under the profiler; the rotary index is made with the inputs, off the prefill):", "",
             "| checkpoint | vision blocks | images (groups) | prefill ms | vision tower | language model | "
             "rotary index (with the inputs) | kernels: count, ms | top kernels (ms) |", "|---|---|---|---|---|---|---|---|---|"]
    for name, p in sorted(prefills.items()):
        top = "; ".join(f"{k['name'][:40]} {k['ms']:.1f}" for k in p["top_kernels"][:3])
        blocks = f"compiled ({p['compile_s']:.0f} s to compile)" if p.get("compiled_vision") else "eager"
        lines.append(f"| {name.removesuffix('-compiled')} | {blocks} | {p['images']} "
                     f"({'+'.join(map(str, p['prefill_groups']))}) | {p['wall_ms']:.1f} | {p['vision_ms']:.1f} | "
                     f"{p['language_ms']:.1f} | {p['rope_index_ms']:.1f} | {p['kernels']:,}, {p['kernel_ms']:.1f} | {top} |")
    return lines


def attention_lines(attentions: dict[str, dict]) -> list[str]:
    """gpu.sh's decode attention candidates (benchmarks/bench_decode_attention.py --json): µs per call, each way."""
    lines = ["", "The decode step's attention alone (benchmarks/bench_decode_attention.py: each way compiled or uncompiled "
             "as its column says, replayed from a CUDA graph; µs per call, median; 16 query and 2 key/value heads "
             "of 128; Δ: the largest difference of a way's output from the first way's):", ""]
    for name, report in sorted(attentions.items()):
        ways = list(dict.fromkeys(r["way"] for r in report["results"]))
        lines += [f"| {name}: batch | keys | " + " | ".join(ways) + " |", "|---|---|" + "---|" * len(ways)]
        cells: dict[tuple[int, int], dict[str, str]] = {}
        for r in report["results"]:
            diff = f" (Δ {r['max_abs_diff']:.0e})" if r.get("max_abs_diff") else ""  # against the first way's output
            cells.setdefault((r["batch"], r["keys"]), {})[r["way"]] = (f"{r['us_p50']:.1f}{diff}" if "us_p50" in r
                                                                       else f"failed ({r['error'][:60]})")
        lines += [f"| {batch} | {keys} | " + " | ".join(by.get(w, "–") for w in ways) + " |"
                  for (batch, keys), by in sorted(cells.items())]
    return lines


def kernel_lines(kernels: dict[str, dict]) -> list[str]:
    """gpu.sh's kernel counts (benchmarks/bench_kernels.py --json): the compiled decode step per layer."""
    lines = ["", "The compiled decode step (benchmarks/bench_kernels.py: inductor's Triton code, what one decoder "
             "layer adds):", "", "| checkpoint | graph breaks | generated kernels / layer | library calls / layer | all / layer |",
             "|---|---|---|---|---|"]
    for name, counted in sorted(kernels.items()):
        for figures in counted["families"].values():
            generated, library = figures["generated_per_layer"], figures["library_per_layer"]
            lines.append(f"| {name} | {figures['graph_breaks']} | {generated:g} | {library:g} | {generated + library:g} |")
    return lines


def table(benches: list[dict], infers: dict[str, tuple[dict, dict]], device: dict | None, vision: dict | None = None,
          runs: list[tuple[dict, dict]] = (), mixes: dict[str, dict] | None = None, kernels: dict[str, dict] | None = None,
          tests: str | None = None, prefills: dict[str, dict] | None = None,
          attentions: dict[str, dict] | None = None) -> str:
    everything = benches + [r for pair in infers.values() for r in pair]
    stacks = sorted({f"transformers {v['transformers']}, torch {v['torch']}" for r in everything if (v := r.get("versions"))})
    gpu = f"{device['gpu']} (CUDA {device['cuda']})" if device else "GPU"
    lines = [f"### {gpu} — {'; '.join(stacks) or 'versions not recorded'}", ""]
    if benches:
        w = benches[0]["workload"]
        lines += [
            f"448-px synthetic images, {w['max_new_tokens']} new tokens forced, {w['warmup']} warm-up + {w['repeats']} "
            "timed runs per row; medians. Batch 1 runs the first 8 images (its steps must fit a 10-minute slice), "
            "larger batches all 32. Written by benchmarks/gpu.sh.",
            "",
            "| checkpoint | mode | batch | samples | tokens/s | TTFT p50 ms | decode ms/step | decode GB/s | % of peak | "
            "TTFT: vision / language model ms |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        lines += ["| " + " | ".join(cells) + " |" for cells in rows(benches)]
    if infers:
        lines += ["", "| checkpoint | compile + capture, first run (s) | second run (s) | cache | tokens/s (2nd) |",
                  "|---|---|---|---|---|"]
        for name, (a, b) in sorted(infers.items()):
            cache = ",".join(c["cache"] for c in (b.get("compile_cache") or {}).get("compiles", [])) or "–"
            lines.append(f"| {name} | {a.get('compile_s') or 0:.1f} | {b.get('compile_s') or 0:.1f} | {cache} | "
                         f"{b.get('tokens_per_s') or 0:.1f} |")
    if vision:
        lines += vision_lines(vision)
    if runs:
        lines += run_lines(runs)
    if mixes:
        lines += length_lines(mixes)
    if prefills:
        lines += prefill_lines(prefills)
    if attentions:
        lines += attention_lines(attentions)
    if kernels:
        lines += kernel_lines(kernels)
    if tests:
        lines += ["", f"tests/test_cuda.py on this machine: {tests}"]
    if not (benches or infers or vision or runs or mixes or kernels or tests or prefills or attentions):
        lines.append("No finished report yet.")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir", type=Path, help="gpu.sh's OUT_DIR")
    parser.add_argument("--write", action="store_true", help="also replace the GPU section of RESULTS.md")
    args = parser.parse_args()
    benches, infers = collect(args.out_dir)
    device_file, vision_file = args.out_dir / "device.json", args.out_dir / "reports" / "vision.json"
    runs = [(_read(w), _read(w.parent / "sweep.json")) for w in sorted(args.out_dir.glob("reports/run-*/wall.json"))
            if (w.parent / "sweep.json").exists()]
    mixes = {p.name.removesuffix("-lengths.json"): m for p in sorted(args.out_dir.glob("reports/*-lengths.json"))
             if (m := _read(p)) is not None}
    kernels = {p.name.removesuffix("-kernels.json"): k for p in sorted(args.out_dir.glob("reports/*-kernels.json"))
               if (k := _read(p)) is not None}
    prefills = {p.name.removesuffix("-prefill.json"): f for p in sorted(args.out_dir.glob("reports/*-prefill.json"))
                if (f := _read(p)) is not None}
    attentions = {p.name.removesuffix("-decode-attention.json"): a
                  for p in sorted(args.out_dir.glob("reports/*-decode-attention.json")) if (a := _read(p)) is not None}
    tests_file = args.out_dir / "reports" / "cuda-tests.txt"
    tests = tests_file.read_text().strip().splitlines()[-1].strip("= ") if tests_file.exists() and tests_file.read_text().strip() else None
    text = table(benches, infers, _read(device_file) if device_file.exists() else None,
                 _read(vision_file) if vision_file.exists() else None, runs, mixes, kernels, tests, prefills, attentions)
    print(text)
    (args.out_dir / "table.md").write_text(text, encoding="utf-8")
    if args.write:
        from bench_infer import record

        record(text, "gpu")


if __name__ == "__main__":
    main()
