"""``vlmfast infer``: the command line of :func:`vlmfast.run.runner.infer`; its options are the fields of
:class:`vlmfast.run.options.InferOptions` (:mod:`vlmfast.cli.build`)."""

from __future__ import annotations

import typer

from vlmfast.cli.build import takes
from vlmfast.cli.common import EXIT_CODES_HELP, Command, Json, UsageError, command, explicit_params, finishing, guarded
from vlmfast.run.options import InferOptions


@command(cls=Command, epilog=EXIT_CODES_HELP)
@takes(InferOptions)
def infer(ctx: typer.Context, parsed, json_out: Json = False):
    """Generate for images + prompts with the KV cache forced on; JSONL results and a timing report."""

    def run():
        from vlmfast.report.parity import render_parity
        from vlmfast.report.progress import ProgressBar
        from vlmfast.report.terminal import print_json, render_infer
        from vlmfast.run.parallel import is_main_process
        from vlmfast.run.runner import infer as run_infer

        out = parsed.values["out"]
        out = None if out is not None and str(out) == "-" else out  # "--out -": rows on stdout, as with no --out
        if json_out and out is None:
            raise UsageError("--json prints the report on stdout, so results need a file", hint="add --out results.jsonl")
        options = parsed.build(out=out, rows_to_stdout=out is None, explicit=explicit_params(ctx))
        bar = ProgressBar(enabled=None if is_main_process() else False)
        try:
            report = run_infer(options, progress=bar)
        finally:
            bar.stop()
        if is_main_process():
            with finishing():
                render_infer(report)
                render_parity(report.parity)
                if json_out:
                    print_json(report.as_dict())

    guarded(run, json_out, interrupted="rerun the same command (a run given --out keeps the rows it wrote and resumes "
                                     "after them)")
