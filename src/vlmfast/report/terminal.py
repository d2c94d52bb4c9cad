"""The only module that renders tables: Rich output on stderr, JSON on stdout (progress bars: :mod:`vlmfast.report.progress`)."""

from __future__ import annotations

import json
import re
import sys

from rich.console import Console
from rich.markup import escape
from rich.table import Table

_TRAILING = re.compile(r"[ \t]+(?=\n)")


class _TrimmedStderr:
    """``sys.stderr``, looked up at every write (a test or a caller may swap it), with the spaces rich pads each
    table line with to the table's width cut off the line's end: a log holds the text, not 150 columns of blanks."""

    def write(self, text: str) -> int:
        sys.stderr.write(_TRAILING.sub("", text))
        return len(text)

    def flush(self) -> None:
        sys.stderr.flush()

    def isatty(self) -> bool:
        return False

    @property
    def encoding(self) -> str:
        return getattr(sys.stderr, "encoding", None) or "utf-8"


def _console() -> Console:
    """Rich on stderr. Not on a terminal (a CI log, a pipe) rich assumes 80 columns and would wrap cells and cut
    intervals short: there the width is COLUMNS when set, else 200, so a table keeps every number on its line,
    and lines carry no trailing padding (on a terminal the padding clears what a live bar drew)."""
    import os

    # notes and hints: one line each, greppable; no emoji codes: an id or a path is printed as written
    # ("coco:train:12" is not "coco🚋12")
    console = Console(stderr=True, highlight=False, soft_wrap=True, emoji=False)
    if not console.is_terminal:
        width = int(os.environ["COLUMNS"]) if os.environ.get("COLUMNS", "").isdigit() else 200
        console = Console(file=_TrimmedStderr(), highlight=False, soft_wrap=True, width=width, emoji=False)
    return console


stderr = _console()


def print_json(data: dict) -> None:
    """One JSON object on stdout: the machine-readable contract for CI scripts."""
    sys.stdout.write(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
    sys.stdout.flush()


def _fmt(value, unit: str = "", digits: int = 2) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:,.{digits}f}{unit}"
    return f"{value}{unit}"


def plural(n: int, word: str, many: str | None = None) -> str:
    return f"{n} {word if n == 1 else many or word + 's'}"


def render_infer(report) -> None:
    """The KV-cache timing report of an ``infer`` run, on stderr (a run with nothing left to do: its notes)."""
    if report.samples == 0 and report.skipped_existing:
        for note in report.notes:
            render_note(note)
        return
    cache = report.cache
    table = Table(title="vlmfast infer", show_header=False, title_justify="left", box=None, padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    off = escape(", ".join(cache["found_off"]) or "nowhere")
    table.add_row("checkpoint", escape(report.checkpoint))
    if report.fingerprint:
        fp = report.fingerprint
        table.add_row("weights", f"{fp['digest']} ({plural(fp['tensors'], 'tensor')}, {fp['bytes'] / 2**20:,.1f} MiB)" + (f": {escape(fp['of'])}" if fp.get("of") else ""))
    table.add_row("KV cache", f"saved off in: {off} → [green]forced on[/green]" if cache["found_off"] else "[green]on[/green] (as saved)")
    speed = [report.decoder + " decoder"] + (["CUDA graphs"] if report.cuda_graphs else []) + (["compiled"] if report.compiled else [])
    batching = (f"{report.batch_size} decode rows, continuous ({plural(report.batches, 'admission')})"
                if report.batching == "continuous" else f"batch {report.batch_size} ({plural(report.batches, 'batch', 'batches')})")
    table.add_row("runtime", f"{report.device} · {report.dtype} · {report.attn} · {' + '.join(speed)} · {batching}")
    if report.processes:
        per = " · ".join(f"#{p['rank']} {p['device']}: {plural(p['samples'], 'sample')}, {_fmt(p['tokens_per_s'], ' tokens/s', 1)}"
                         for p in report.processes)
        table.add_row("processes", f"{len(report.processes)} ({per})")
    failed = (report.scores or {}).get("reward_errors") or 0
    table.add_row("samples", f"{report.samples} run, {plural(report.errors, 'error')}"
                  + (f", [red]{plural(failed, 'reward error')}[/red] (unscored: see reward_error)" if failed else "")
                  + f", {plural(report.skipped_existing, 'id')} already done")
    table.add_row("finish", f"eos {report.finish['eos']} · length {report.finish['length']} · no <answer> {report.no_answer}")
    scores = report.scores or {}
    if scores.get("scored"):
        table.add_row("accuracy", f"{_pct(scores['accuracy'])} of {plural(scores['scored'], 'scored row')} · format ok "
                      f"{_pct(scores['format_rate'])} · answer not parsed {scores['answer_parse_failures']}"
                      f" · in <answer> tags {_pct(scores.get('tagged_accuracy'))} of {scores.get('tagged_rows', 0)}")
    elif scores.get("format_rate") is not None:
        table.add_row("format", f"{_pct(scores['format_rate'])} of rows have <think>…</think><answer>…</answer> (no ground truth to score)")
    table.add_row("new tokens", _fmt(report.new_tokens))
    h = scores.get("health") or {}
    if h.get("new_tokens_p50") is not None:
        table.add_row("health", f"length p50 {_fmt(h['new_tokens_p50'], '', 0)} / p90 {_fmt(h['new_tokens_p90'], '', 0)} / "
                      f"max {h['new_tokens_max']} tokens · truncated {_pct(h['truncation_rate'])} · repeating "
                      f"{_pct(h['repetition_rate'])} · empty answer {_pct(h['empty_answer_rate'])} · several answers "
                      f"{_pct(h['multi_answer_rate'])}")
    if scores.get("rewards"):
        table.add_row("reward", _reward_line(scores))
    samples = scores.get("samples")
    if samples and samples.get("pass_at_k"):
        table.add_row("n answers", "pass@k · maj@k · all same reward: " + _samples_cell(samples))
    table.add_row("load", _fmt(report.load_s, " s") + (f"  (compile + capture {report.compile_s:.1f} s, apart)" if report.compile_s else ""))
    table.add_row("generate (after load)", _fmt(report.generate_s, " s") + f"  (preprocess {_fmt(report.preprocess_s, ' s')}, "
                  f"{_fmt(report.preprocess_exposed_s, ' s')} of it not overlapped)")
    fill = f", then cache fill {_fmt(report.cache_fill_s, ' s')}" if report.cache_fill_s is not None else ""
    table.add_row("prefill", f"{_fmt(report.prefill_s, ' s')} (vision tower {_fmt(report.vision_s, ' s')}{fill}) · "
                  f"TTFT p50 / p90 {_fmt(report.ttft_ms_p50, ' ms', 1)} / {_fmt(report.ttft_ms_p90, ' ms', 1)}")
    decode = _fmt(report.decode_ms_per_token, " ms/token")
    if report.decode_gb_per_s is not None:
        decode += f" · {r:,.1f} GB/s read" if (r := report.decode_gb_per_s) >= 1 else f" · {r * 1000:,.0f} MB/s read"
        if report.bandwidth_pct_of_peak is not None:
            decode += f" ({report.bandwidth_pct_of_peak:.0f}% of the device's {report.peak_gb_per_s:,.0f} GB/s)"
    if report.decode_row_utilization is not None:
        decode += f" · {report.decode_row_utilization:.0%} of row-steps made an answer token"
    table.add_row("decode", decode)
    table.add_row("throughput", f"{_fmt(report.tokens_per_s, ' tokens/s', 1)} · {_fmt(report.samples_per_s, ' samples/s', 3)}")
    table.add_row("peak memory", f"{_fmt(report.peak_mem_mib, ' MiB', 0)} ({report.peak_mem_kind})")
    if report.out:
        table.add_row("results", escape(report.out))
    stderr.print(table)
    for note in report.notes:
        render_note(note)


def _reward_line(summary: dict) -> str:
    """The reward's mean, each sub-score's mean, and what decided correctness."""
    rewards = summary.get("rewards") or {}
    subs = " · ".join(f"{escape(k)} {_fmt(v, '', 3)}" for k, v in (rewards.get("subscores") or {}).items())
    judged = rewards.get("correct_from")
    return (f"mean {_fmt(summary.get('mean_score'), '', 3)}" + (f" · sub-scores: {subs}" if subs else "")
            + (f" · correct: its {escape(judged)} sub-score ≥ --reward-threshold" if judged else ""))


def _pct(value) -> str:
    return "–" if value is None else f"{value:.1%}"


def render_error(error) -> None:
    stderr.print(f"[bold red]error:[/bold red] {escape(error.message)}", highlight=False)
    if error.hint:
        stderr.print(f"[bold]hint:[/bold] {escape(error.hint)}")


def render_note(text: str) -> None:
    stderr.print(f"[yellow]note:[/yellow] {escape(text)}")


FLAG_MARKS = {"format_only_gain": "format", "length_blowup": "long", "length_collapse": "short",
              "truncation": "trunc", "repetition": "loop", "collapse_after_peak": "collapse",
              "reward_without_accuracy": "reward"}


def render_sweep(report: dict) -> None:
    """``vlmfast sweep``: one line per checkpoint (with its difference from base, its health and its flags), the
    engine's switches, the best one, the flags' messages, the gate, on stderr."""
    stderr.print(sweep_table(report))
    if report.get("by"):
        _sweep_groups(report)
    # the engine's switches of this run: a checkpoint read back keeps the figures of the run that evaluated it
    switched = _switches([c for c in report["checkpoints"] if not c.get("read_back")])
    if switched:
        stderr.print(f"engine: {switched}")
    elif report["checkpoints"] and all(c.get("read_back") for c in report["checkpoints"]):
        stderr.print("engine: not started (every checkpoint's rows were already in the output directory)")
    best, failed = report["best"], sum(c.get("reward_errors") or 0 for c in report["checkpoints"])
    where = ("base" if best.get("label") == "base" else f"step {best['step']}") if best else ""
    held = ""
    if best and best.get("p_best") is not None:
        bases = {c["step"] for c in report["checkpoints"] if c.get("label") == "base"}  # the --base model only
        others = ["base" if s in bases else str(s) for s in best.get("indistinguishable", []) if s != best["step"]]
        held = (f", P(best) {best['p_best']:.0%} (how often it is highest when the {best['requests']} requests are "
                f"resampled; not the chance it is truly best, and it overstates the observed best); ≈ no paired test "
                f"shows it below another step (Holm over every two steps, alpha {best['alpha']}): "
                f"{', '.join(others) or 'no other step'}")
    scored = [c["accuracy"] for c in report["checkpoints"] if c.get("accuracy") is not None]
    if best and len(scored) > 1 and len(set(scored)) == 1:  # nothing to choose: not a "best" at all
        stderr.print(f"best: a tie — every checkpoint scored {_pct(best['accuracy'])}; none is better than another")
    else:
        stderr.print(f"best: {where} ({escape(best['path'])}), accuracy {_pct(best['accuracy'])}{held}" if best
                     else f"best: none ({failed} reward call(s) failed: see reward_error in the step files)" if failed
                     else "best: none (interrupted before a checkpoint was evaluated)" if report.get("interrupted")
                     and not report["checkpoints"] else "best: none (no checkpoint was evaluated)" if not report["checkpoints"]
                     else "best: none (no row had ground truth to score)")
    for f in report.get("flags", []):
        stderr.print(f"[yellow]flag {f['code']}:[/yellow] {escape(f['message'])}")
    if report["gate"] and report["gate"]["failed"]:
        stderr.print(f"[red]gate:[/red] {escape(report['gate']['message'])}")
    judged = sorted({c["correct_from"] for c in report["checkpoints"] if c.get("correct_from")})
    if judged:
        render_note(f"accuracy: a row is correct when the reward's {', '.join(judged)} sub-score reaches "
                    "--reward-threshold (the total also weights other sub-scores)")
    for note in report["notes"]:
        render_note(note)


def _sweep_groups(report: dict, shown: int = 6) -> None:
    """``sweep --by``: each checkpoint's accuracy per value of the column (the largest groups), and the best step
    of each value."""
    from rich import box

    checkpoints = [c for c in report["checkpoints"] if c.get("by")]
    sizes: dict[str, int] = {}
    for c in checkpoints:
        for name, g in c["by"].items():
            sizes[name] = max(sizes.get(name, 0), g.get("requests", g["scored"]))  # requests, not answers (--n)
    names = sorted(sizes, key=lambda n: (-sizes[n], n))[:shown]
    if not names:
        return
    table = Table(title=f"accuracy by {escape(report['by'])}", title_justify="left", box=box.SIMPLE_HEAD,
                  show_edge=False, pad_edge=False)
    table.add_column("step")
    for name in names:
        table.add_column(f"{escape(name)} ({sizes[name]})", justify="right")
    label = lambda c: "base" if c["label"] == "base" else str(c["step"])  # noqa: E731
    for c in checkpoints:
        table.add_row(label(c), *[_pct((c["by"].get(n) or {}).get("accuracy")) for n in names])
    stderr.print(table)
    best = []
    for name in names:
        scored = [c for c in checkpoints if (c["by"].get(name) or {}).get("accuracy") is not None]
        if len({c["by"][name]["accuracy"] for c in scored}) == 1 and len(scored) > 1:  # nothing to choose
            best.append(f"{escape(name)}: a tie ({_pct(scored[0]['by'][name]['accuracy'])})")
        elif scored:
            top = max(scored, key=lambda c: (c["by"][name]["accuracy"], -c["step"]))
            best.append(f"{escape(name)}: {label(top)} ({_pct(top['by'][name]['accuracy'])})")
    stderr.print(f"best step by {escape(report['by'])}: " + " · ".join(best)
                 + (f" · {len(sizes) - shown} smaller group(s) in report.json" if len(sizes) > shown else ""))


def sweep_table(report: dict) -> Table:
    """The sweep's table, one line per checkpoint. Kept within 100 columns where it can be: no outer box, rates
    without decimals from 10 % up, the error column only when a row failed, each step's engine switch in one
    line below the table (:func:`_switches`; per step in report.json)."""
    from rich import box

    table = Table(title=f"vlmfast sweep: {escape(report['run_dir'])}", title_justify="left", box=box.SIMPLE_HEAD,
                  show_edge=False, pad_edge=False, collapse_padding=True)
    checkpoints = report["checkpoints"]
    samples = any(c.get("samples") for c in checkpoints)
    errors = any(c.get("errors") or c.get("reward_errors") for c in checkpoints)
    held = any(c.get("p_best") is not None for c in checkpoints)
    rewarded = any(c.get("reward_mean") is not None for c in checkpoints)
    columns = ["step", "accuracy\n(95 % CI)", *(["P(best)\n≈ best"] if held else []), "vs base\n(flips)", "format",
               "tokens\np50/p90", "trunc", "loop", *(["pass@k · maj@k\n· all same reward"] if samples else []),
               *(["reward\n(sub-scores)"] if rewarded else []), "tokens/s", *(["errors"] if errors else []), "flags"]
    for column in columns:
        table.add_column(column, justify="left" if column == "flags" else "right", no_wrap=column == "step",
                         overflow="fold")  # narrower than the table: cells wrap, no figure is cut to "…"
    flags: dict[int, list[str]] = {}
    for f in report.get("flags", []):
        flags.setdefault(f["step"], []).append(FLAG_MARKS.get(f["code"], f["code"]))
    for c in checkpoints:
        ci = f" ({_rate(c['ci_low'], False)}–{_rate(c['ci_high'])})" if c["ci_low"] is not None else ""
        vs = c.get("vs_base")
        versus = (f"{vs['difference'] * 100:+.1f} pp ({vs['wrong_to_right']}↑ {vs['right_to_wrong']}↓)"
                  if vs and vs.get("difference") is not None else "–")
        lengths = "/".join("–" if c.get(k) is None else f"{c[k]:.0f}" for k in ("new_tokens_p50", "new_tokens_p90"))
        extra = [_samples_cell(c.get("samples"))] if samples else []
        if rewarded:
            subs = " · ".join(f"{escape(k)} {_fmt(v, '', 2)}" for k, v in (c.get("reward_score_means") or {}).items())
            extra.append(_fmt(c.get("reward_mean"), "", 2) + (f" ({subs})" if subs else ""))
        failed = [str(c.get("errors", 0)) + (f" + {c['reward_errors']} reward" if c.get("reward_errors") else "")]
        chance = [_held_cell(c)] if held else []
        table.add_row("base" if c["label"] == "base" else str(c["step"]), _pct(c["accuracy"]) + ci, *chance, versus,
                      _rate(c["format_rate"]), lengths, _rate(c.get("truncation_rate")), _rate(c.get("repetition_rate")),
                      *extra, _fmt(c["tokens_per_s"], "", 0), *(failed if errors else []),
                      " ".join(flags.get(c["step"], [])))
    return table


def _held_cell(c: dict) -> str:
    """P(best) and ``≈`` when the step is not told apart from the best (the best itself included)."""
    if c.get("p_best") is None:
        return "–"
    return f"{c['p_best']:.0%}" + (" ≈" if c.get("near_best") else "")


def _rate(value, sign: bool = True) -> str:
    """A rate in a narrow cell: one decimal under 10 % (the flags' 5 % bounds stay readable), none above."""
    if value is None:
        return "–"
    shown = f"{value * 100:.1f}" if value < 0.1 else f"{value * 100:.0f}"
    return shown.removesuffix(".0") + ("%" if sign else "")


def _switches(checkpoints: list[dict]) -> str:
    """How the engine moved between checkpoints, in one line: "loaded 1× (12.3 s) · swapped 49× (median 1.21 s)"."""
    from vlmfast.timing import percentile

    parts = []
    for key, word in (("load_s", "loaded"), ("engine_start_s", "vLLM engine started"), ("swap_s", "swapped in place"),
                      ("reload_s", "reloaded")):
        seconds = [c[key] for c in checkpoints if c.get(key)]
        if seconds:
            each = f"{seconds[0]:.1f} s" if len(seconds) == 1 else f"median {percentile(seconds, 50):.2f} s"
            parts.append(f"{word} {len(seconds)}× ({each})")
    return " · ".join(parts)


def _samples_cell(samples: dict | None) -> str:
    """pass@k and maj@k at the largest k (all of a request's answers), and the all-same rate, of a run with several
    answers per request."""
    if not samples or not samples.get("pass_at_k"):
        return "–"
    k = max(samples["pass_at_k"], key=int)
    return f"{_pct(samples['pass_at_k'][k])} · {_pct(samples.get('maj_at_k'))} · {_pct(samples.get('all_same_rate'))} (k={k})"


def render_scores(source: str, summary: dict) -> None:
    """``vlmfast score``: accuracy and format rate overall and per scorer, on stderr."""
    table = Table(title=f"vlmfast score: {escape(source)}", title_justify="left")
    for column in ("scorer", "scored", "accuracy", "mean score", "answer not parsed"):
        table.add_column(column, justify="left" if column == "scorer" else "right")
    groups = [("all", summary)] + sorted(summary.get("by_scorer", {}).items())
    for name, g in groups:
        table.add_row(name, str(g.get("scored") or 0), _pct(g.get("accuracy")), _fmt(g.get("mean_score"), "", 3),
                      str(g.get("answer_parse_failures") or 0))
    stderr.print(table)
    if summary.get("by"):
        _render_groups(summary["by"])
    stderr.print(f"accuracy over answers in <answer> tags: {_pct(summary.get('tagged_accuracy'))} of "
                 f"{plural(summary.get('tagged_rows', 0), 'row')}")
    stderr.print(f"format ok (<think>…</think><answer>…</answer>): {_pct(summary.get('format_rate'))} · "
                 f"mean think {_fmt(summary.get('mean_think_chars'), ' chars', 0)} · "
                 f"mean answer {_fmt(summary.get('mean_answer_chars'), ' chars', 0)} · "
                 f"{plural(summary.get('rows_without_truth', 0), 'row')} without ground truth")
    if (summary.get("samples") or {}).get("pass_at_k"):
        stderr.print("n answers: pass@k · maj@k · all same reward: " + _samples_cell(summary["samples"]))
    if summary.get("reward_errors"):
        stderr.print(f"[red]{plural(summary['reward_errors'], 'row')} whose reward function raised[/red]: unscored, left out of "
                     "the accuracy (see each row's reward_error; add --out to keep them)")
    rewards = summary.get("rewards") or {}
    if rewards:
        stderr.print("reward: " + _reward_line(summary))
    for name, figures in rewards.get("functions", {}).items():
        stderr.print(f"reward {escape(name)}: mean {_fmt(figures['mean'], '', 3)}"
                     + (f" · not applicable to {plural(figures['not_applicable_rows'], 'row')}" if figures["not_applicable_rows"] else ""))
    if rewards.get("not_applicable_rows"):
        stderr.print(f"{plural(rewards['not_applicable_rows'], 'row')} every reward function called not applicable (None): left out of the scores")
    if summary.get("bbox_spaces"):
        stderr.print("boxes read in: " + ", ".join(f"{space} ({n})" for space, n in sorted(summary["bbox_spaces"].items())))
    for note in summary.get("notes", []):
        render_note(note)


def _render_groups(by: dict, shown: int = 40) -> None:
    """``score --by``: accuracy per value of a column, the largest groups first."""
    table = Table(title=f"by {escape(by['column'])}", title_justify="left")
    for column in (by["column"], "rows", "scored", "accuracy", "answer not parsed"):
        table.add_column(escape(column), justify="left" if column == by["column"] else "right")
    groups = list(by["groups"].items())
    for name, g in groups[:shown]:
        table.add_row(escape(name), str(g["rows"]), str(g["scored"]), _pct(g.get("accuracy")), str(g["answer_parse_failures"]))
    stderr.print(table)
    if len(groups) > shown:
        stderr.print(f"… and {plural(len(groups) - shown, 'smaller group')} (all in --json)")
    if by.get("rows_without_value"):
        stderr.print(f"{plural(by['rows_without_value'], 'row')} without a {escape(by['column'])}: in no group")


SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}


def render_findings(checkpoint: str, findings) -> None:
    """``vlmfast doctor``'s findings on stderr, one block each with the exact fix (a list rather than a
    table: fixes are long commands, and CI logs are 80 columns wide)."""
    if not findings:
        stderr.print(f"[green]{escape(checkpoint)}: no findings[/green]")
        return
    stderr.print(f"[bold]vlmfast doctor[/bold]: {escape(checkpoint)}")
    for f in findings:
        style = SEVERITY_STYLE.get(f.severity, "")
        stderr.print(f"[{style}]{f.severity.upper():7}[/] [bold]{escape(f.code)}[/bold]  {escape(f.location)}")
        stderr.print(f"        {escape(f.message)}", highlight=False)
        if f.fix:
            stderr.print(f"        [bold]fix:[/bold] {escape(f.fix)}", highlight=False)
    counts = {s: sum(f.severity == s for f in findings) for s in SEVERITY_STYLE}
    stderr.print(", ".join(plural(n, s) for s, n in counts.items() if n))
