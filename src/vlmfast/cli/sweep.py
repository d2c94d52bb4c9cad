"""``vlmfast sweep``: the command line of :func:`vlmfast.run.sweep.sweep`; its options are the fields of
:class:`vlmfast.run.sweep_options.SweepOptions`, infer's among them (:mod:`vlmfast.cli.build`)."""

from __future__ import annotations

from pathlib import Path

import typer

from vlmfast.cli.build import takes
from vlmfast.cli.common import EXIT_CODES_HELP, Command, Json, command, explicit_params, finishing, guarded
from vlmfast.run.sweep_options import SweepOptions


@command(cls=Command, epilog=EXIT_CODES_HELP)
@takes(SweepOptions)
def sweep(ctx: typer.Context, parsed, json_out: Json = False):
    """Evaluate every checkpoint of a training run (and its base) on one manifest: which step is best?"""

    def run():
        from vlmfast.report.parity import render_parity
        from vlmfast.report.progress import ProgressBar
        from vlmfast.report.terminal import print_json, render_note, render_sweep
        from vlmfast.report.trackers import Trackers
        from vlmfast.run.sweep import publish, sweep as run_sweep
        from vlmfast.run.sweep_page import write_sweep_dir

        # --base is the run's starting model (step 0), not a LoRA adapter's base; --overwrite clears the whole
        # out dir once, before the first checkpoint (each checkpoint's run resumes its own file)
        options = parsed.build(infer={"ckpt": parsed.values["run_dir"], "explicit": explicit_params(ctx)})
        out_dir = Path(options.out_dir)
        # checked by SweepOptions; kept open across the sweep: --watch logs as it goes
        trackers = Trackers(tensorboard=options.tensorboard, wandb=options.wandb, check=False)
        bar = ProgressBar()
        try:
            try:
                report = run_sweep(options, progress=bar, say=bar.note,
                                   on_report=(lambda so_far: _log_now(trackers, so_far, bar.note)) if trackers else None)
            finally:
                bar.stop()
            with finishing(report["exit_code"]):
                render_sweep(report)
                render_parity(report.get("parity"))
                for line in write_sweep_dir(report, out_dir) + publish(report, options, trackers=trackers):
                    render_note(line)
                if json_out:
                    print_json(report)
        finally:
            trackers.close()
        if report["exit_code"]:
            raise typer.Exit(report["exit_code"])

    guarded(run, json_out, interrupted="rerun the same command (the checkpoints it finished are kept in --out-dir, and "
                                     "it goes on after the rows it wrote)")


def _log_now(trackers, report: dict, say) -> None:
    """--watch: the report so far to the trackers; a failure is said and the sweep goes on (the final
    report is logged again at the end)."""
    from vlmfast.errors import VlmfastError

    try:
        for line in trackers.log(report):
            say(line)
    except VlmfastError as exc:
        say(f"{exc.message} (the sweep goes on)")
