"""``vlmfast bench``'s report: its table on the terminal, report.md, and the directory ``--report`` writes
(report.md, report.json, plot.png, report.html). Built on :mod:`vlmfast.report.terminal`'s console and
number formats."""

from __future__ import annotations

import json

from rich.markup import escape
from rich.table import Table

from vlmfast.report.terminal import _fmt, render_note, stderr


BENCH_COLUMNS = (
    ("tokens/s", "tokens_per_s", 1), ("samples/s", "samples_per_s", 3), ("wall s (median run)", "wall_s_median", 3),
    ("wall s min", "wall_s_min", 3), ("wall s max", "wall_s_max", 3), ("run-to-run CV %", "wall_cv_pct", 1),
    ("TTFT p50 ms", "ttft_ms_p50", 1), ("TTFT p90 ms", "ttft_ms_p90", 1),
    ("  of which vision tower ms (p50 per batch)", "ttft_vision_ms_p50", 1),
    ("  of which language model ms (p50 per batch)", "ttft_language_ms_p50", 1),
    ("cache fill ms (p50 per batch)", "cache_fill_ms_p50", 1), ("decode ms/token", "decode_ms_per_token", 2),
    ("mean new tokens", "mean_new_tokens", 1), ("mean think tokens", "mean_think_tokens", 1),
    ("mean answer tokens", "mean_answer_tokens", 1),
    ("decode GB/s", "decode_gb_per_s", 1), ("% of peak bandwidth", "bandwidth_pct_of_peak", 1),
    ("no <answer>", "no_answer_rate", 2), ("truncated", "truncation_rate", 2), ("peak MiB", "peak_mem_mib", 0),
    ("accuracy", "accuracy", 3), ("format ok", "format_rate", 3),
)


def bench_table(report: dict) -> Table:
    table = Table(title="vlmfast bench", title_justify="left")
    table.add_column("metric", style="bold")
    for s in report["scenarios"]:
        table.add_column(f"{s['name']}\nbatch {s['batch_size']}", justify="right")
    for label, key, digits in BENCH_COLUMNS:
        table.add_row(label, *(_fmt(s.get(key), "", digits) for s in report["scenarios"]))
    return table


def render_bench(report: dict, gate_messages: list[str] = ()) -> None:
    """The side-by-side table, ratios, fidelity and cache findings, on stderr."""
    stderr.print(bench_table(report))
    for name, values in report["ratios"].items():
        shown = ", ".join(f"{k} {v:.2f}×" for k, v in values.items() if v is not None)
        stderr.print(f"[bold]{escape(name)}[/bold]: {shown}")
    for name, share in report["fidelity"].items():
        shown = "–" if share is None else f"{share:.0%} of samples have identical greedy tokens"
        stderr.print(f"[bold]fidelity {name}[/bold]: {shown}")
    for name, r in (report.get("accuracy") or {}).items():  # with ground truth: ckpt − base, paired
        if r.get("difference") is not None:
            test = "McNemar" if (report.get("workload") or {}).get("n", 1) == 1 else "sign-flip"  # paired_p's
            p = "" if r.get("p_value") is None else f", {test} p = {r['p_value']:.3g}"
            stderr.print(f"[bold]accuracy {escape(name)}[/bold]: {r['difference'] * 100:+.1f} points (95 % CI "
                         f"{r['ci_low'] * 100:+.1f} to {r['ci_high'] * 100:+.1f}) over {r['n']} samples{p}")
    off = report["cache"]["found_off"]
    stderr.print("[bold]checkpoint cache as saved[/bold]: " + escape("off in " + ", ".join(off) if off else "on"))
    for note in report["notes"]:
        render_note(note)
    for message in gate_messages:
        stderr.print(f"[bold red]gate:[/bold red] {escape(message)}")


def bench_markdown(report: dict) -> str:
    """report.md: the same figures as the table, for a PR comment or a results file."""
    names = [f"{s['name']} (batch {s['batch_size']})" for s in report["scenarios"]]
    lines = [f"# vlmfast bench: {report['checkpoint']}", ""]
    w = report["workload"]
    lines.append(f"{w['samples']} samples, max {w['max_new_tokens']} new tokens (ignore_eos={w['ignore_eos']}), "
                 f"{w['warmup']} warm-up + {w['repeats']} timed runs per scenario; medians. "
                 f"transformers {report['versions']['transformers']}, torch {report['versions']['torch']}.")
    lines += ["", "| metric | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for label, key, digits in BENCH_COLUMNS:
        cells = ["–" if s.get(key) is None else f"{s[key]:.{digits}f}" for s in report["scenarios"]]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines.append("")
    for name, values in report["ratios"].items():
        lines.append(f"- {name}: " + ", ".join(f"{k} {v:.2f}×" for k, v in values.items() if v is not None))
    for name, share in report["fidelity"].items():
        lines.append(f"- fidelity {name}: " + ("–" if share is None else f"{share:.0%} identical greedy tokens"))
    off = report["cache"]["found_off"]
    lines.append("- checkpoint cache as saved: " + ("off in " + ", ".join(off) if off else "on"))
    lines += [f"- note: {note}" for note in report["notes"]]
    return "\n".join(lines) + "\n"


def write_bench_dir(report: dict, directory) -> tuple[list[str], str | None]:
    """report.md, report.json, report.html and (with matplotlib) plot.png in ``directory``. Returns the paths
    written and a note when the plot could not be made."""
    from pathlib import Path

    from vlmfast.report.html import write_bench_html
    from vlmfast.report.plot import plot_available, write_plot

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    markdown = bench_markdown(report)
    (out / "report.md").write_text(markdown, encoding="utf-8")
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    written = [str(out / "report.md"), str(out / "report.json")]
    plot = write_plot(report, out / "plot.png") if plot_available() else None
    written += [str(plot)] if plot else []
    written.append(str(write_bench_html(markdown, out / "report.html", plot)))
    return written, None if plot else "no plot: matplotlib is not installed (pip install 'vlmfast[plot]')"
