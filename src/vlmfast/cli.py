"""Typer commands: parse options → build the library's config → call the library → render.

Heavy imports (torch, transformers) happen inside command bodies so ``vlmfast --help`` is instant.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from .errors import EXIT_INTERRUPTED, UsageError, VlmfastError

EXIT_CODES_HELP = """Exit codes: 0 ok · 1 unexpected failure · 2 bad input, options or checkpoint (nothing written) ·
3 bench --fail-if-slower tripped · 4 bench --fail-on-cache-off tripped · 130 interrupted (rerun to resume)."""

app = typer.Typer(
    name="vlmfast",
    help="Fast, honest inference for GRPO-trained vision-language checkpoints (Qwen2.5-VL).",
    epilog=EXIT_CODES_HELP,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

MODEL = "Model"
INPUT = "Inputs"
GEN = "Generation"
OUTPUT = "Output"

Ckpt = Annotated[str, typer.Option("--ckpt", help="Checkpoint dir, trainer output dir (highest checkpoint-N wins) or hub id.", rich_help_panel=MODEL)]
Device = Annotated[Optional[str], typer.Option(help="auto | cpu | cuda | cuda:N", rich_help_panel=MODEL)]
Dtype = Annotated[Optional[str], typer.Option(help="auto (CUDA bf16, CPU float32) | bfloat16 | float16 | float32", rich_help_panel=MODEL)]
Attn = Annotated[Optional[str], typer.Option(help="auto (flash_attention_2 when installed, else sdpa) | flash_attention_2 | sdpa | eager", rich_help_panel=MODEL)]
TrustRemote = Annotated[bool, typer.Option("--trust-remote-code", help="Run the checkpoint's own Python code (off by default).", rich_help_panel=MODEL)]
Base = Annotated[Optional[str], typer.Option("--base", help="LoRA adapter checkpoints: the base model (default: the one adapter_config.json names).", rich_help_panel=MODEL)]
Merge = Annotated[bool, typer.Option("--merge", help="LoRA adapter checkpoints: merge the adapter into the weights before generating.", rich_help_panel=MODEL)]
AllowPickle = Annotated[bool, typer.Option("--allow-pickle", help="Load pickle (*.bin) weights, which can run code (default: safetensors only).", rich_help_panel=MODEL)]
MaxImagePixels = Annotated[int, typer.Option(min=1, help="Refuse images with more pixels than this (decompression bombs).", rich_help_panel="Inputs")]
MaxBatchTokens = Annotated[Optional[int], typer.Option(min=1, help="Cap on padded prefill tokens per batch (batch length × widest prompt).", rich_help_panel="Generation")]
Images = Annotated[Optional[list[str]], typer.Option("--images", help="Image files, directories or globs (repeat or list after one flag).", rich_help_panel=INPUT)]
Prompt = Annotated[Optional[str], typer.Option(help="Prompt applied to every image.", rich_help_panel=INPUT)]
PromptFile = Annotated[Optional[str], typer.Option(help="File holding the prompt for every image.", rich_help_panel=INPUT)]
Manifest = Annotated[Optional[str], typer.Option(help='JSONL, one request per line: {"id", "image"|"images", "prompt", "system"} or ms-swift {"messages", "images"}.', rich_help_panel=INPUT)]
Template = Annotated[str, typer.Option(help="plain | r1 (append VLM-R1's think/answer instruction).", rich_help_panel=INPUT)]
System = Annotated[Optional[str], typer.Option(help="System prompt.", rich_help_panel=INPUT)]
MaxPixels = Annotated[Optional[int], typer.Option(help="Max pixels per image (default: the processor's, capped at 1280·28·28).", rich_help_panel=INPUT)]
MinPixels = Annotated[Optional[int], typer.Option(help="Min pixels per image (default: the processor's).", rich_help_panel=INPUT)]
SkipBad = Annotated[bool, typer.Option("--skip-bad", help="Record an error row per bad input and run the rest (default: fail before loading).", rich_help_panel=INPUT)]
BatchSize = Annotated[int, typer.Option(min=1, help="Samples per generate call (batches are formed by cost).", rich_help_panel=GEN)]
AutoBatchSize = Annotated[str, typer.Option(help="Samples per generate call, or auto (CUDA: from free memory; CPU: 8). Batches are formed by cost.", rich_help_panel=GEN)]
MaxNew = Annotated[int, typer.Option(min=1, help="Cap on new tokens per sample.", rich_help_panel=GEN)]
Temperature = Annotated[float, typer.Option(min=0.0, help="0 = greedy (default).", rich_help_panel=GEN)]
TopP = Annotated[float, typer.Option(min=0.0, max=1.0, help="Nucleus sampling (with --temperature > 0).", rich_help_panel=GEN)]
Seed = Annotated[Optional[int], typer.Option(help="Random seed (sampling).", rich_help_panel=GEN)]
IgnoreEos = Annotated[bool, typer.Option("--ignore-eos", help="Always decode --max-new-tokens (benchmarks).", rich_help_panel=GEN)]
Out = Annotated[Optional[str], typer.Option(help="JSONL results file (default: stdout). Rerunning skips ids already there.", rich_help_panel=OUTPUT)]
Overwrite = Annotated[bool, typer.Option("--overwrite", help="Redo ids already in --out.", rich_help_panel=OUTPUT)]
RetryErrors = Annotated[bool, typer.Option("--retry-errors", help="Resume, and redo the ids whose earlier row is an error row.", rich_help_panel=OUTPUT)]
Json = Annotated[bool, typer.Option("--json", help="Print the report as one JSON object on stdout (needs --out).", rich_help_panel=OUTPUT)]
JsonFindings = Annotated[bool, typer.Option("--json", help="Print the findings as one JSON object on stdout.", rich_help_panel=OUTPUT)]


def _version(value: bool):
    if value:
        from . import __version__

        typer.echo(f"vlmfast {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True, help="Show the version.")] = False):
    """Fast, honest inference for GRPO-trained vision-language checkpoints (Qwen2.5-VL)."""


def _guarded(fn):
    """Render VlmfastErrors once with their hint and exit code; Ctrl-C exits 130 with a resume hint."""
    from .parallel import is_main_process
    from .report import render_error, stderr

    try:
        return fn()
    except VlmfastError as exc:
        if is_main_process():  # every process of a parallel run hits the same input error: say it once
            render_error(exc)
        raise typer.Exit(exc.exit_code) from None
    except KeyboardInterrupt:
        stderr.print("[yellow]interrupted:[/yellow] finished batches are saved; rerun the same command to resume.")
        raise typer.Exit(EXIT_INTERRUPTED) from None


@app.command(epilog=EXIT_CODES_HELP)
def infer(
    ckpt: Ckpt,
    images: Images = None,
    prompt: Prompt = None,
    prompt_file: PromptFile = None,
    manifest: Manifest = None,
    template: Template = "plain",
    system: System = None,
    max_pixels: MaxPixels = None,
    min_pixels: MinPixels = None,
    skip_bad: SkipBad = False,
    max_image_pixels: MaxImagePixels = 89_478_485,
    batch_size: AutoBatchSize = "auto",
    max_batch_tokens: MaxBatchTokens = None,
    overlap: Annotated[Optional[bool], typer.Option("--overlap/--no-overlap", help="Prepare the next batch while this one generates (default: on CUDA; on a CPU it competes for the cores).", rich_help_panel=GEN)] = None,
    compile_: Annotated[bool, typer.Option("--compile", help="Static KV cache + torch.compile of the decode step (compile time reported apart).", rich_help_panel=GEN)] = False,
    max_new_tokens: MaxNew = 1024,
    temperature: Temperature = 0.0,
    top_p: TopP = 1.0,
    seed: Seed = None,
    ignore_eos: IgnoreEos = False,
    device: Device = None,
    dtype: Dtype = None,
    attn: Attn = None,
    trust_remote_code: TrustRemote = False,
    allow_pickle: AllowPickle = False,
    base: Base = None,
    merge: Merge = False,
    out: Out = None,
    overwrite: Overwrite = False,
    retry_errors: RetryErrors = False,
    json_out: Json = False,
):
    """Generate for images + prompts with the KV cache forced on; JSONL results and a timing report."""

    def run():
        from .engine import GenerationSettings
        from .parallel import is_main_process
        from .report import ProgressBar, print_json, render_infer
        from .runner import InferOptions, infer as run_infer

        if json_out and out is None:
            raise UsageError("--json prints the report on stdout, so results need a file", hint="add --out results.jsonl")
        if batch_size != "auto" and not (batch_size.isdigit() and int(batch_size) >= 1):
            raise UsageError(f"--batch-size {batch_size}: expected a positive integer or auto", hint="e.g. --batch-size 8")
        options = InferOptions(
            ckpt=ckpt, images=images, prompt=prompt, prompt_file=prompt_file, manifest=manifest, template=template,
            system=system, out=out, overwrite=overwrite, retry_errors=retry_errors, skip_bad=skip_bad,
            batch_size=None if batch_size == "auto" else int(batch_size),
            generation=GenerationSettings(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                                          seed=seed, ignore_eos=ignore_eos),
            min_pixels=min_pixels, max_pixels=max_pixels, device=device, dtype=dtype, attn=attn,
            trust_remote_code=trust_remote_code, allow_pickle=allow_pickle, max_batch_tokens=max_batch_tokens,
            max_image_pixels=max_image_pixels, overlap=overlap, base=base, merge=merge, compile=compile_,
        )
        bar = ProgressBar(enabled=None if is_main_process() else False)
        try:
            report = run_infer(options, progress=bar)
        finally:
            bar.stop()
        if not is_main_process():
            return
        render_infer(report)
        if json_out:
            print_json(report.as_dict())

    _guarded(run)


@app.command(epilog=EXIT_CODES_HELP)
def bench(
    ckpt: Ckpt,
    compare_base: Annotated[Optional[str], typer.Option(help="Base model (dir or hub id) run on the same workload.", rich_help_panel=MODEL)] = None,
    images: Images = None,
    manifest: Manifest = None,
    synthetic: Annotated[Optional[int], typer.Option(min=1, help="Generate N synthetic images as the workload.", rich_help_panel=INPUT)] = None,
    synthetic_size: Annotated[int, typer.Option(min=28, help="Side of synthetic images in pixels.", rich_help_panel=INPUT)] = 224,
    prompt: Prompt = None,
    template: Template = "plain",
    max_pixels: MaxPixels = None,
    min_pixels: MinPixels = None,
    max_new_tokens: Annotated[int, typer.Option(min=1, help="Cap on new tokens per sample.", rich_help_panel=GEN)] = 128,
    ignore_eos: IgnoreEos = False,
    batch_sizes: Annotated[str, typer.Option(help="Comma-separated batch sizes for ckpt (and base), e.g. 1,8.", rich_help_panel=GEN)] = "8",
    warmup: Annotated[int, typer.Option(min=0, help="Untimed runs per scenario.", rich_help_panel=GEN)] = 1,
    repeats: Annotated[int, typer.Option(min=1, help="Timed runs per scenario (medians reported).", rich_help_panel=GEN)] = 3,
    compile_: Annotated[bool, typer.Option("--compile", help="ckpt and base: static KV cache + torch.compile (compiled in the warm-up runs).", rich_help_panel=GEN)] = False,
    as_saved: Annotated[bool, typer.Option("--as-saved/--no-as-saved", help="Also run plain HF generate with the saved config (slow when the cache is off).", rich_help_panel=GEN)] = True,
    device: Device = None,
    dtype: Dtype = None,
    attn: Attn = None,
    report_dir: Annotated[Optional[Path], typer.Option("--report", help="Write report.md, report.json and plot.png here.", rich_help_panel=OUTPUT)] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the report as one JSON object on stdout.", rich_help_panel=OUTPUT)] = False,
    fail_if_slower: Annotated[Optional[float], typer.Option(min=1.0, help="Exit 3 when ckpt tokens/s < base tokens/s ÷ X.", rich_help_panel="Gates")] = None,
    fail_on_cache_off: Annotated[bool, typer.Option("--fail-on-cache-off", help="Exit 4 when the saved config turns the cache off anywhere.", rich_help_panel="Gates")] = False,
):
    """The same workload on the checkpoint (vlmfast), as saved (plain generate) and on its base, side by side."""

    def run():
        from .bench import BenchOptions, apply_gates, run_bench
        from .engine import GenerationSettings
        from .report import ProgressBar, print_json, render_bench, render_note, write_bench_dir

        try:
            sizes = tuple(int(x) for x in batch_sizes.split(",") if x.strip())
        except ValueError:
            sizes = ()
        if not sizes or min(sizes) < 1:
            raise UsageError(f"--batch-sizes {batch_sizes!r}: expected positive integers", hint="e.g. --batch-sizes 1,8")
        if not (images or manifest or synthetic):
            raise UsageError("no workload", hint="give --images, --manifest or --synthetic N")
        if fail_if_slower is not None and not compare_base:
            raise UsageError("--fail-if-slower compares with the base", hint="add --compare-base BASE")
        options = BenchOptions(
            ckpt=ckpt, compare_base=compare_base, images=images, manifest=manifest, synthetic=synthetic,
            synthetic_size=synthetic_size, prompt=prompt, template=template,
            generation=GenerationSettings(max_new_tokens=max_new_tokens, ignore_eos=ignore_eos),
            batch_sizes=sizes, warmup=warmup, repeats=repeats, as_saved=as_saved, device=device, dtype=dtype,
            attn=attn, max_pixels=max_pixels, min_pixels=min_pixels, compile=compile_,
        )
        bar = ProgressBar()
        try:
            report = run_bench(options, progress=bar, say=render_note if not bar.live else (lambda text: None))
        finally:
            bar.stop()
        code = apply_gates(report, fail_if_slower, fail_on_cache_off)
        render_bench(report, report["gates"]["messages"])
        if report_dir is not None:
            written, note = write_bench_dir(report, report_dir)
            render_note("wrote " + ", ".join(written))
            if note:
                render_note(note)
        if json_out:
            print_json(report)
        if code:
            raise typer.Exit(code)

    _guarded(run)


@app.command(epilog="Exit codes: 0 ok (or findings without --strict) · 1 error-level findings with --strict · 2 bad checkpoint path.")
def doctor(
    ckpt: Annotated[str, typer.Argument(help="Checkpoint dir or trainer output dir.")],
    base: Annotated[Optional[str], typer.Option(help="Base model dir to compare EOS list, vocabulary and files with.")] = None,
    json_out: JsonFindings = False,
    strict: Annotated[bool, typer.Option("--strict", help="Exit 1 on any error-level finding (for CI).")] = False,
):
    """Diagnose a trained checkpoint: cache off, lost EOS or processor files, unmerged shards, LoRA, unsafe weights."""

    def run():
        from .doctor import diagnose, findings_as_dicts, locate, strict_exit_code
        from .report import print_json, render_findings

        where = str(locate(ckpt).path)
        findings = diagnose(ckpt, base=base)
        if json_out:
            print_json({"checkpoint": where, "base": base, "findings": findings_as_dicts(findings)})
        render_findings(where, findings)
        if strict and (code := strict_exit_code(findings)):
            raise typer.Exit(code)

    _guarded(run)


@app.command(epilog="Exit codes: 0 fixed, or nothing to fix · 2 bad path, read-only dir or hub id (nothing written).")
def fix(
    ckpt: Annotated[str, typer.Argument(help="Checkpoint dir to repair in place (backups: *.orig).")],
    processor_from: Annotated[Optional[str], typer.Option(help="Base model dir to copy missing processor, tokenizer and chat-template files (and the EOS list) from.")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the unified diff; write nothing.")] = False,
    merge_lora: Annotated[Optional[Path], typer.Option(help="CKPT is a LoRA adapter: write a merged full checkpoint to this dir.")] = None,
):
    """Repair a checkpoint's configs (cache on, EOS list) and missing files, atomically with backups; or merge a LoRA adapter."""

    def run():
        from .fix import apply_fix, merge_lora as merge, plan_fix
        from .report import render_note, stderr

        if merge_lora is not None:
            if dry_run:
                raise UsageError("--dry-run does not apply to --merge-lora", hint="drop one of them")
            result = merge(ckpt, merge_lora, base=processor_from)
            stderr.print(f"merged {ckpt} into {result.out_dir} (base {result.base})")
            typer.echo(str(result.out_dir))
            return
        plan = plan_fix(ckpt, processor_from=processor_from)
        if plan.empty:
            render_note(f"{ckpt}: nothing to fix")
            return
        result = apply_fix(plan, dry_run=dry_run)
        if dry_run:
            typer.echo(result.diff, nl=False)
            render_note("dry run: nothing was written")
            return
        for change in plan.changes():
            stderr.print(f"fixed: {change}")
        for backup in result.backups:
            stderr.print(f"backup: {backup}")

    _guarded(run)


@app.command("make-checkpoint")
def make_checkpoint(
    out: Annotated[Path, typer.Argument(help="Directory to write the checkpoint into.")],
    preset: Annotated[str, typer.Option(help="tiny (tests) | demo (~6M params, cache-off cost visible on a CPU)")] = "tiny",
    like: Annotated[str, typer.Option(help="grpo (use_cache false everywhere, as trainers save) | base")] = "grpo",
    seed: Annotated[int, typer.Option(help="Weight seed.")] = 0,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an existing directory.")] = False,
):
    """Build a tiny random-weight Qwen2.5-VL checkpoint offline (real model class and processor)."""

    def run():
        from .report import stderr
        from .tiny import build_checkpoint

        try:
            path = build_checkpoint(out, preset=preset, like=like, seed=seed, overwrite=overwrite)
        except ValueError as exc:
            raise UsageError(str(exc), hint="see vlmfast make-checkpoint --help") from None
        stderr.print(f"checkpoint ({preset}, like {like}) in {path}")
        typer.echo(str(path))

    _guarded(run)


@app.command("make-images")
def make_images(
    out: Annotated[Path, typer.Argument(help="Directory to write PNGs into.")],
    n: Annotated[int, typer.Option("-n", "--n", min=1, help="How many images.")] = 8,
    seed: Annotated[int, typer.Option(help="Content seed.")] = 0,
    size: Annotated[Optional[int], typer.Option(min=28, help="Square side in pixels (default: a mix of small sizes).")] = None,
):
    """Write deterministic sample images (for demos and benchmarks)."""

    def run():
        from .tiny import make_images as make

        for path in make(out, n=n, seed=seed, sizes=[(size, size)] if size else None):
            typer.echo(str(path))

    _guarded(run)


@app.command()
def demo(
    workdir: Annotated[Optional[Path], typer.Option(help="Where to build the demo checkpoint and images (reused).")] = None,
    max_new_tokens: MaxNew = 64,
    batch_size: BatchSize = 8,
):
    """Build (or reuse) a GRPO-like demo checkpoint and images, then run infer on them — offline, CPU-friendly."""

    def run():
        from .demo import run_demo

        run_demo(workdir, max_new_tokens=max_new_tokens, batch_size=batch_size)

    _guarded(run)


MULTI_VALUE_OPTIONS = ("--images",)


def spread_multi_value(argv: list[str], options=MULTI_VALUE_OPTIONS) -> list[str]:
    """``--images a.png b.png dir/`` (what a shell glob expands to) → ``--images a.png --images b.png
    --images dir/``: click options take one value each, users type lists."""
    out: list[str] = []
    current = None  # the list option whose values we are reading
    for arg in argv:
        if arg.startswith("-"):
            name = arg.split("=", 1)[0]
            current = name if name in options else None
        elif current is not None and not (out and out[-1] == current):
            out.append(current)
        out.append(arg)
    return out


def main() -> None:
    import sys

    app(args=spread_multi_value(sys.argv[1:]), prog_name="vlmfast")
