"""``vlmfast sweep``: the command line of :func:`vlmfast.run.sweep.sweep`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from vlmfast.cli.common import (EXIT_CODES_HELP, INPUT, OUTPUT, Command, batch_size_value, command, explicit_params, from_params,
                                guarded, sharing)
from vlmfast.cli.infer import infer as infer_command

# infer's options that a sweep passes to each checkpoint's run, declared once in infer
FROM_INFER = ("prompt", "prompt_file", "prompt_key", "answer_key", "image_key", "template", "format_prompt", "system", "max_pixels", "min_pixels", "skip_bad", "batch_size", "max_batch_tokens",
              "max_new_tokens", "temperature", "top_p", "seed", "n", "ignore_eos", "decoder", "batching", "cuda_graphs", "compile_", "threads",
              "device", "dtype", "attn", "allow_missing", "fingerprint", "scorer", "iou", "bbox_space", "reward", "reward_weights",
              "reward_kwargs", "reward_threshold", "match_training", "json_out", "engine", "tensor_parallel_size", "data_parallel_size",
              "pipeline_parallel_size", "distributed_executor_backend", "gpu_memory_utilization", "max_num_seqs")


@command(cls=Command, epilog=EXIT_CODES_HELP)
@sharing(infer_command, FROM_INFER)
def sweep(
    ctx: typer.Context,
    run_dir: Annotated[str, typer.Argument(help="A training run's output dir: checkpoint-N (HF Trainer, VLM-R1, TRL), vX-*/checkpoint-N (ms-swift) or global_step_N/actor/huggingface (EasyR1, verl).", show_default=False)],
    manifest: Annotated[str, typer.Option(help="The evaluation set with ground truth: JSONL, or the trainer's parquet / save_to_disk dataset (see infer --manifest).", rich_help_panel=INPUT)],
    out_dir: Annotated[Path, typer.Option(help="Where each checkpoint's results file, report.json and plot.png go (rerun to resume).", rich_help_panel=OUTPUT)],
    base: Annotated[Optional[str], typer.Option(help="The model the run started from (dir or hub id), evaluated as step 0: did RL help?", rich_help_panel=INPUT)] = None,
    steps: Annotated[Optional[str], typer.Option(help="Only these steps, comma-separated (e.g. 100,300).", rich_help_panel=INPUT)] = None,
    watch: Annotated[bool, typer.Option("--watch", help="Keep polling RUN_DIR and evaluate new checkpoints as the trainer writes them (once their weights are complete), until Ctrl-C.", rich_help_panel=INPUT)] = False,
    poll: Annotated[float, typer.Option(help="--watch: seconds between looks at RUN_DIR.", rich_help_panel=INPUT)] = 60.0,
    fail_if_best_below: Annotated[Optional[float], typer.Option(help="Exit 5 when the best checkpoint's accuracy is below X (CI after training).", rich_help_panel="Gates")] = None,
    search: Annotated[str, typer.Option(help="all: every checkpoint; coarse: every k-th one (--every), then the best's neighbours until both are evaluated.", rich_help_panel=INPUT)] = "all",
    every: Annotated[Optional[int], typer.Option(help="--search coarse: evaluate every k-th checkpoint first (default: about 8 of them).", rich_help_panel=INPUT)] = None,
    canary: Annotated[int, typer.Option(help="--engine vllm: after the first in-place weight reload, check N requests against a fresh engine (0: no check).", rich_help_panel=INPUT)] = 8,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Start afresh: remove an earlier sweep's rows and records from OUT_DIR (a rerun resumes otherwise; with other settings it stops and says what differs).", rich_help_panel=OUTPUT)] = False,
    tensorboard: Annotated[Optional[str], typer.Option(help="A TensorBoard log dir (the trainer's works): each checkpoint's figures as scalars at its step under eval/vlmfast, in DIR/vlmfast-sweep-<manifest> (a rerun replaces that file). Logged with the report, and with --watch after each new checkpoint (the tensorboard extra).", rich_help_panel=OUTPUT)] = None,
    wandb: Annotated[Optional[str], typer.Option(help="PROJECT (a new run) or PROJECT/RUN (the run with id RUN, resumed if it exists: the trainer's works; only steps it lacks are added): each checkpoint's figures to W&B at its step. Logged with the report, and with --watch after each new checkpoint (the wandb extra; WANDB_MODE=offline works).", rich_help_panel=OUTPUT)] = None,
    **shared,
):
    """Evaluate every checkpoint of a training run (and its base) on one manifest: which step is best?"""
    params = {**locals(), **shared}
    batch_size, json_out = shared["batch_size"], shared["json_out"]

    def run():
        from vlmfast.errors import UsageError
        from vlmfast.report.parity import render_parity
        from vlmfast.run.options import InferOptions
        from vlmfast.report.terminal import ProgressBar, print_json, render_note, render_sweep
        from vlmfast.report.trackers import Trackers
        from vlmfast.run.sweep import SweepOptions, publish, sweep as run_sweep, write_sweep_dir

        try:
            wanted = tuple(int(s) for s in steps.split(",") if s.strip()) if steps else None
        except ValueError:
            raise UsageError(f"--steps {steps!r}: expected step numbers", hint="e.g. --steps 100,300") from None
        # --base here is the run's starting model (step 0), not a LoRA adapter's base
        infer = from_params(InferOptions, params, ckpt=run_dir, base=None, batch_size=batch_size_value(batch_size),
                            overwrite=False, explicit=explicit_params(ctx))  # --overwrite clears the whole out dir once, before the first checkpoint
        options = SweepOptions(run_dir=run_dir, out_dir=str(out_dir), infer=infer, base=base, steps=wanted,
                               fail_if_best_below=fail_if_best_below, watch=watch, poll_s=poll, search=search,
                               every=every, canary=canary, overwrite=overwrite, tensorboard=tensorboard, wandb=wandb)
        # checked by SweepOptions; kept open across the sweep: --watch logs as it goes
        trackers = Trackers(tensorboard=options.tensorboard, wandb=options.wandb, check=False)
        bar = ProgressBar()
        try:
            try:
                report = run_sweep(options, progress=bar, say=bar.note,
                                   on_report=(lambda so_far: _log_now(trackers, so_far, bar.note)) if trackers else None)
            finally:
                bar.stop()
            render_sweep(report)
            render_parity(report.get("parity"))
            for line in write_sweep_dir(report, out_dir) + publish(report, options, trackers=trackers):
                render_note(line)
        finally:
            trackers.close()
        if json_out:
            print_json(report)
        if report["exit_code"]:
            raise typer.Exit(report["exit_code"])

    guarded(run)


def _log_now(trackers, report: dict, say) -> None:
    """--watch: the report so far to the trackers; a failure is said and the sweep goes on (the final
    report is logged again at the end)."""
    from vlmfast.errors import VlmfastError

    try:
        for line in trackers.log(report):
            say(line)
    except VlmfastError as exc:
        say(f"{exc.message} (the sweep goes on)")
