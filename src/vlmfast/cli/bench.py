"""``vlmfast bench``: the command line of :func:`vlmfast.run.bench.run_bench`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from vlmfast.cli.common import (EXIT_CODES_HELP, FAST, GEN, INPUT, MODEL, OUTPUT, Attn, BboxSpace, Ckpt, Command, CudaGraphs,
                     Decoder, Device, Dtype, IgnoreEos, Images, Iou, Json, Manifest, MaxPixels, MinPixels, Prompt,
                     Scorer, Template, command, from_params, guarded, sharing)
from vlmfast.cli.infer import infer as infer_command


@command(cls=Command, epilog=EXIT_CODES_HELP)
@sharing(infer_command, ("temperature", "top_p", "seed", "n"))
def bench(
    ckpt: Ckpt,
    compare_base: Annotated[Optional[str], typer.Option(help="Base model (dir or hub id) run on the same workload.", rich_help_panel=MODEL)] = None,
    images: Images = None,
    manifest: Manifest = None,
    synthetic: Annotated[Optional[int], typer.Option(help="Generate N synthetic images as the workload.", rich_help_panel=INPUT)] = None,
    synthetic_size: Annotated[int, typer.Option(help="Side of synthetic images in pixels.", rich_help_panel=INPUT)] = 224,
    prompt: Prompt = None,
    template: Template = "plain",
    max_pixels: MaxPixels = None,
    min_pixels: MinPixels = None,
    max_new_tokens: Annotated[int, typer.Option(help="Cap on new tokens per sample.", rich_help_panel=GEN)] = 128,
    ignore_eos: IgnoreEos = False,
    batch_sizes: Annotated[str, typer.Option(help="Comma-separated batch sizes for ckpt (and base), e.g. 1,8.", rich_help_panel=GEN)] = "8",
    warmup: Annotated[int, typer.Option(help="Untimed runs per scenario.", rich_help_panel=GEN)] = 1,
    repeats: Annotated[int, typer.Option(help="Timed runs per scenario (medians reported).", rich_help_panel=GEN)] = 3,
    decoder: Decoder = "vlmfast",
    cuda_graphs: CudaGraphs = None,
    compile_: Annotated[bool, typer.Option("--compile/--no-compile", help="ckpt and base: torch.compile the decode step (compiled in the warm-up runs).", rich_help_panel=FAST)] = False,
    engines: Annotated[str, typer.Option(help="Engines for ckpt, comma-separated: hf, vllm (hf,vllm: side by side, with token agreement).", rich_help_panel=MODEL)] = "hf",
    as_saved: Annotated[bool, typer.Option("--as-saved/--no-as-saved", help="Also run plain HF generate with the saved config (slow when the cache is off).", rich_help_panel=GEN)] = True,
    device: Device = None,
    dtype: Dtype = None,
    attn: Attn = None,
    scorer: Scorer = "auto",
    iou: Iou = 0.5,
    bbox_space: BboxSpace = None,
    report_dir: Annotated[Optional[Path], typer.Option("--report", help="Write report.md, report.json and plot.png here.", rich_help_panel=OUTPUT)] = None,
    json_out: Json = False,
    fail_if_slower: Annotated[Optional[float], typer.Option(help="Exit 3 when ckpt tokens/s < base tokens/s ÷ X.", rich_help_panel="Gates")] = None,
    fail_on_cache_off: Annotated[bool, typer.Option("--fail-on-cache-off", help="Exit 4 when the saved config turns the cache off anywhere.", rich_help_panel="Gates")] = False,
    fail_if_less_accurate: Annotated[Optional[float], typer.Option(help="Exit 5 when ckpt accuracy < base accuracy − X (needs ground truth in --manifest).", rich_help_panel="Gates")] = None,
    **shared,
):
    """The same workload on the checkpoint (vlmfast), as saved (plain generate) and on its base, side by side."""
    params = {**locals(), **shared}

    def run():
        from vlmfast.run.bench import BenchOptions, run_bench
        from vlmfast.report.terminal import ProgressBar, print_json, render_bench, render_note, write_bench_dir

        options = from_params(BenchOptions, params)  # generation: max_new_tokens, ignore_eos, temperature, top_p, seed, n
        if report_dir is not None:
            from vlmfast.files import check_output_dir

            check_output_dir("--report", report_dir)  # before the bench runs, not after
        bar = ProgressBar(unit="timed runs")
        try:
            report = run_bench(options, progress=bar, say=render_note if not bar.live else (lambda text: None))
        finally:
            bar.stop()
        render_bench(report, report["gates"]["messages"])
        if report_dir is not None:
            written, note = write_bench_dir(report, report_dir)
            render_note("wrote " + ", ".join(written))
            if note:
                render_note(note)
        if json_out:
            print_json(report)
        if report["gates"]["exit_code"]:
            raise typer.Exit(report["gates"]["exit_code"])

    guarded(run)


