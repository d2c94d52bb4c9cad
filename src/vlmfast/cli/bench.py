"""``vlmfast bench``: the command line of :func:`vlmfast.run.bench.run_bench`; its options are the fields of
:class:`vlmfast.run.bench_options.BenchOptions`, infer's among them by reference (:mod:`vlmfast.cli.build`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from vlmfast.cli.build import takes
from vlmfast.cli.common import EXIT_CODES_HELP, OUTPUT, Command, Json, command, finishing, guarded
from vlmfast.run.bench_options import BenchOptions


@command(cls=Command, epilog=EXIT_CODES_HELP)
@takes(BenchOptions)
def bench(
    parsed,
    report_dir: Annotated[Optional[str], typer.Option("--report", help="Write report.md, report.json, report.html and plot.png here.", rich_help_panel=OUTPUT)] = None,
    json_out: Json = False,
):
    """The same workload on the checkpoint (vlmfast), as saved (plain generate) and on its base, side by side."""

    def run():
        from vlmfast.run.bench import run_bench
        from vlmfast.report.bench_report import render_bench, write_bench_dir
        from vlmfast.report.progress import ProgressBar
        from vlmfast.report.terminal import print_json, render_note

        options = parsed.build()
        if report_dir is not None:
            from vlmfast.files import check_output_dir

            check_output_dir("--report", report_dir)  # before the bench runs, not after
        bar = ProgressBar(unit="timed runs")
        try:
            report = run_bench(options, progress=bar, say=render_note if not bar.live else (lambda text: None))
        finally:
            bar.stop()
        with finishing(report["gates"]["exit_code"]):
            render_bench(report, report["gates"]["messages"])
            if report_dir is not None:
                written, note = write_bench_dir(report, Path(report_dir))
                render_note("wrote " + ", ".join(written))
                if note:
                    render_note(note)
            if json_out:
                print_json(report)
        if report["gates"]["exit_code"]:
            raise typer.Exit(report["gates"]["exit_code"])

    guarded(run, json_out, interrupted="nothing was written (bench writes its report only once every scenario is "
                                     "measured); rerun the same command to measure again")
