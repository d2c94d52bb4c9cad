"""Typer commands: parse options → build the library's config → call the library → render.

Heavy imports (torch, transformers) happen inside command bodies so ``vlmfast --help`` is instant.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from typer.core import TyperArgument, TyperCommand

from .errors import EXIT_INTERRUPTED, UsageError, VlmfastError

EXIT_CODES_HELP = """Exit codes: 0 ok · 1 unexpected failure · 2 bad input, options or checkpoint (nothing written) ·
3 bench --fail-if-slower tripped · 4 bench --fail-on-cache-off tripped · 5 bench --fail-if-less-accurate tripped ·
130 interrupted (rerun to resume)."""


class Command(TyperCommand):
    """Help as people write it: ``vlmfast doctor [OPTIONS] CKPT`` and flags without a type label."""

    def collect_usage_pieces(self, ctx) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if isinstance(param, TyperArgument):
                name = (param.metavar or param.name).upper()
                pieces.append(name if param.required else f"[{name}]")
        return pieces

    def format_help(self, ctx, formatter) -> None:
        for param in self.get_params(ctx):
            if getattr(param, "is_flag", False) and param.metavar is None:  # --help and every on/off option
                param.metavar = ""
            elif isinstance(param, TyperArgument) and param.metavar is None:
                param.metavar = param.name.upper()
        super().format_help(ctx, formatter)


app = typer.Typer(
    name="vlmfast",
    help="Fast, honest inference for GRPO-trained vision-language checkpoints (Qwen2.5-VL).",
    epilog=EXIT_CODES_HELP,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
command = app.command

MODEL = "Model"
INPUT = "Inputs"
GEN = "Generation"
FAST = "Speed"
SCORE = "Scoring"
OUTPUT = "Output"
SCALE = "vLLM engine"

Ckpt = Annotated[str, typer.Option("--ckpt", help="Checkpoint dir, trainer output dir (highest checkpoint-N wins) or hub id.", rich_help_panel=MODEL)]
Device = Annotated[Optional[str], typer.Option(help="auto | cpu | cuda | cuda:N", rich_help_panel=MODEL)]
Dtype = Annotated[Optional[str], typer.Option(help="auto (CUDA bf16, CPU float32) | bfloat16 | float16 | float32", rich_help_panel=MODEL)]
Attn = Annotated[Optional[str], typer.Option(help="auto (flash_attention_2 when installed, else sdpa) | flash_attention_2 | sdpa | eager", rich_help_panel=MODEL)]
TrustRemote = Annotated[bool, typer.Option("--trust-remote-code", help="Run the checkpoint's own Python code (off by default).", rich_help_panel=MODEL)]
Base = Annotated[Optional[str], typer.Option("--base", help="LoRA adapters: the base model (default: the one adapter_config.json names). vLLM engine: also where missing processor files come from.", rich_help_panel=MODEL)]
Merge = Annotated[bool, typer.Option("--merge", help="LoRA adapter checkpoints: merge the adapter into the weights before generating.", rich_help_panel=MODEL)]
AllowPickle = Annotated[bool, typer.Option("--allow-pickle", help="Load pickle (*.bin) weights, which can run code (default: safetensors only).", rich_help_panel=MODEL)]
Engine = Annotated[str, typer.Option(help="hf (vlmfast's engine on transformers) | vllm (vLLM, for many GPUs and big evals).", rich_help_panel=MODEL)]
MaxImagePixels = Annotated[int, typer.Option(min=1, help="Refuse images with more pixels than this (decompression bombs).", rich_help_panel=INPUT)]
MaxBatchTokens = Annotated[Optional[int], typer.Option(min=1, help="Padded prompt tokens through the model at once (prefill: rows × widest prompt; default CPU 2048, CUDA 32768). --decoder hf: caps whole batches.", rich_help_panel=GEN)]
Images = Annotated[Optional[list[str]], typer.Option("--images", help="Image files, directories or globs (repeat or list after one flag).", rich_help_panel=INPUT)]
Prompt = Annotated[Optional[str], typer.Option(help="Prompt applied to every image.", rich_help_panel=INPUT)]
PromptFile = Annotated[Optional[str], typer.Option(help="File holding the prompt for every image.", rich_help_panel=INPUT)]
Manifest = Annotated[Optional[str], typer.Option(help='JSONL, one request per line: {"id", "image"|"images", "prompt", "system", "solution", "scorer"} or ms-swift {"messages", "images"}.', rich_help_panel=INPUT)]
Template = Annotated[str, typer.Option(help="plain | r1 (append VLM-R1's think/answer instruction).", rich_help_panel=INPUT)]
System = Annotated[Optional[str], typer.Option(help="System prompt.", rich_help_panel=INPUT)]
MaxPixels = Annotated[Optional[int], typer.Option(help="Max pixels per image (default: the processor's, capped at 1280·28·28).", rich_help_panel=INPUT)]
MinPixels = Annotated[Optional[int], typer.Option(help="Min pixels per image (default: the processor's).", rich_help_panel=INPUT)]
SkipBad = Annotated[bool, typer.Option("--skip-bad", help="Record an error row per bad input and run the rest (default: fail before loading).", rich_help_panel=INPUT)]
AutoBatchSize = Annotated[str, typer.Option(help="Samples per batch, or auto (CUDA: from free memory; CPU: 8). Batches are formed by cost.", rich_help_panel=GEN)]
MaxNew = Annotated[int, typer.Option(min=1, help="Cap on new tokens per sample.", rich_help_panel=GEN)]
Temperature = Annotated[float, typer.Option(min=0.0, help="0 = greedy (default).", rich_help_panel=GEN)]
TopP = Annotated[float, typer.Option(min=0.0, max=1.0, help="Nucleus sampling (with --temperature > 0).", rich_help_panel=GEN)]
Seed = Annotated[Optional[int], typer.Option(help="Random seed (sampling).", rich_help_panel=GEN)]
IgnoreEos = Annotated[bool, typer.Option("--ignore-eos", help="Always decode --max-new-tokens (benchmarks).", rich_help_panel=GEN)]
Decoder = Annotated[str, typer.Option(help="vlmfast (its own decode loop) | hf (plain model.generate: the reference).", rich_help_panel=FAST)]
CudaGraphs = Annotated[Optional[bool], typer.Option("--cuda-graphs/--no-cuda-graphs", help="Replay the decode step from CUDA graphs (default: on CUDA).", rich_help_panel=FAST)]
Compile = Annotated[Optional[bool], typer.Option("--compile/--no-compile", help="torch.compile the decode step (default: decided after the first batch by what it would save; cached per machine).", rich_help_panel=FAST)]
Overlap = Annotated[Optional[bool], typer.Option("--overlap/--no-overlap", help="Prepare the next batch while this one generates (default: on CUDA; on a CPU it competes for the cores).", rich_help_panel=FAST)]
Scorer = Annotated[str, typer.Option(help="Default scorer for rows with ground truth: auto | exact | number | choice | bbox | contains.", rich_help_panel=SCORE)]
Iou = Annotated[float, typer.Option(min=0.0, max=1.0, help="bbox scorer: IoU needed to count as correct.", rich_help_panel=SCORE)]
BboxSpace = Annotated[str, typer.Option(help="resized (Qwen2.5-VL: boxes in the model's input pixels, mapped back) | original.", rich_help_panel=SCORE)]
Out = Annotated[Optional[str], typer.Option(help="JSONL results file (default: stdout). Rerunning skips ids already there.", rich_help_panel=OUTPUT)]
Overwrite = Annotated[bool, typer.Option("--overwrite", help="Redo ids already in --out.", rich_help_panel=OUTPUT)]
RetryErrors = Annotated[bool, typer.Option("--retry-errors", help="Resume, and redo the ids whose earlier row is an error row.", rich_help_panel=OUTPUT)]
Json = Annotated[bool, typer.Option("--json", help="Print the report as one JSON object on stdout.", rich_help_panel=OUTPUT)]
TensorParallel = Annotated[int, typer.Option(min=1, help="--engine vllm: GPUs per model replica (tensor parallel).", rich_help_panel=SCALE)]
DataParallel = Annotated[int, typer.Option(min=1, help="--engine vllm: model replicas (vLLM's data parallel).", rich_help_panel=SCALE)]
GpuMemory = Annotated[float, typer.Option(min=0.05, max=1.0, help="--engine vllm: share of GPU memory vLLM may take.", rich_help_panel=SCALE)]
MaxNumSeqs = Annotated[Optional[int], typer.Option(min=1, help="--engine vllm: sequences vLLM runs at once (default: vLLM's).", rich_help_panel=SCALE)]


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


def _batch_size(value: str) -> int | None:
    if value == "auto":
        return None
    if not (value.isdigit() and int(value) >= 1):
        raise UsageError(f"--batch-size {value}: expected a positive integer or auto", hint="e.g. --batch-size 8")
    return int(value)


def _choice(option: str, value: str, choices) -> str:
    if value not in choices:
        raise UsageError(f"{option} {value}: unknown", hint=f"use one of: {', '.join(choices)}")
    return value


@command(cls=Command, epilog=EXIT_CODES_HELP)
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
    max_new_tokens: MaxNew = 1024,
    temperature: Temperature = 0.0,
    top_p: TopP = 1.0,
    seed: Seed = None,
    ignore_eos: IgnoreEos = False,
    decoder: Decoder = "vlmfast",
    cuda_graphs: CudaGraphs = None,
    compile_: Compile = None,
    overlap: Overlap = None,
    engine: Engine = "hf",
    tensor_parallel_size: TensorParallel = 1,
    data_parallel_size: DataParallel = 1,
    gpu_memory_utilization: GpuMemory = 0.9,
    max_num_seqs: MaxNumSeqs = None,
    device: Device = None,
    dtype: Dtype = None,
    attn: Attn = None,
    trust_remote_code: TrustRemote = False,
    allow_pickle: AllowPickle = False,
    base: Base = None,
    merge: Merge = False,
    scorer: Scorer = "auto",
    iou: Iou = 0.5,
    bbox_space: BboxSpace = "resized",
    out: Out = None,
    overwrite: Overwrite = False,
    retry_errors: RetryErrors = False,
    json_out: Json = False,
):
    """Generate for images + prompts with the KV cache forced on; JSONL results and a timing report."""

    def run():
        from .engine import DECODERS, GenerationSettings
        from .parallel import is_main_process
        from .report import ProgressBar, print_json, render_infer
        from .runner import InferOptions, infer as run_infer
        from .scoring import BBOX_SPACES, SCORERS

        if json_out and out is None:
            raise UsageError("--json prints the report on stdout, so results need a file", hint="add --out results.jsonl")
        options = InferOptions(
            ckpt=ckpt, images=images, prompt=prompt, prompt_file=prompt_file, manifest=manifest, template=template,
            system=system, out=out, overwrite=overwrite, retry_errors=retry_errors, skip_bad=skip_bad,
            batch_size=_batch_size(batch_size),
            generation=GenerationSettings(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                                          seed=seed, ignore_eos=ignore_eos),
            min_pixels=min_pixels, max_pixels=max_pixels, device=device, dtype=dtype, attn=attn,
            trust_remote_code=trust_remote_code, allow_pickle=allow_pickle, max_batch_tokens=max_batch_tokens,
            max_image_pixels=max_image_pixels, overlap=overlap, base=base, merge=merge,
            decoder=_choice("--decoder", decoder, DECODERS), cuda_graphs=cuda_graphs, compile=compile_,
            scorer=_choice("--scorer", scorer, SCORERS), iou=iou, bbox_space=_choice("--bbox-space", bbox_space, BBOX_SPACES),
            engine=_choice("--engine", engine, ("hf", "vllm")), tensor_parallel_size=tensor_parallel_size,
            data_parallel_size=data_parallel_size, gpu_memory_utilization=gpu_memory_utilization, max_num_seqs=max_num_seqs,
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


@command(cls=Command, epilog=EXIT_CODES_HELP)
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
    bbox_space: BboxSpace = "resized",
    report_dir: Annotated[Optional[Path], typer.Option("--report", help="Write report.md, report.json and plot.png here.", rich_help_panel=OUTPUT)] = None,
    json_out: Json = False,
    fail_if_slower: Annotated[Optional[float], typer.Option(min=1.0, help="Exit 3 when ckpt tokens/s < base tokens/s ÷ X.", rich_help_panel="Gates")] = None,
    fail_on_cache_off: Annotated[bool, typer.Option("--fail-on-cache-off", help="Exit 4 when the saved config turns the cache off anywhere.", rich_help_panel="Gates")] = False,
    fail_if_less_accurate: Annotated[Optional[float], typer.Option(min=0.0, max=1.0, help="Exit 5 when ckpt accuracy < base accuracy − X (needs ground truth in --manifest).", rich_help_panel="Gates")] = None,
):
    """The same workload on the checkpoint (vlmfast), as saved (plain generate) and on its base, side by side."""

    def run():
        from .bench import BenchOptions, apply_gates, run_bench
        from .engine import DECODERS, GenerationSettings
        from .report import ProgressBar, print_json, render_bench, render_note, write_bench_dir
        from .scoring import BBOX_SPACES, SCORERS

        try:
            sizes = tuple(int(x) for x in batch_sizes.split(",") if x.strip())
        except ValueError:
            sizes = ()
        if not sizes or min(sizes) < 1:
            raise UsageError(f"--batch-sizes {batch_sizes!r}: expected positive integers", hint="e.g. --batch-sizes 1,8")
        engine_list = tuple(e.strip() for e in engines.split(",") if e.strip())
        if not engine_list or any(e not in ("hf", "vllm") for e in engine_list):
            raise UsageError(f"--engines {engines!r}: expected hf, vllm or hf,vllm", hint="e.g. --engines hf,vllm")
        if not (images or manifest or synthetic):
            raise UsageError("no workload", hint="give --images, --manifest or --synthetic N")
        if (fail_if_slower is not None or fail_if_less_accurate is not None) and not compare_base:
            raise UsageError("--fail-if-slower and --fail-if-less-accurate compare with the base", hint="add --compare-base BASE")
        options = BenchOptions(
            ckpt=ckpt, compare_base=compare_base, images=images, manifest=manifest, synthetic=synthetic,
            synthetic_size=synthetic_size, prompt=prompt, template=template,
            generation=GenerationSettings(max_new_tokens=max_new_tokens, ignore_eos=ignore_eos),
            batch_sizes=sizes, warmup=warmup, repeats=repeats, as_saved=as_saved, device=device, dtype=dtype,
            attn=attn, max_pixels=max_pixels, min_pixels=min_pixels, compile=compile_, cuda_graphs=cuda_graphs,
            decoder=_choice("--decoder", decoder, DECODERS), engines=engine_list,
            scorer=_choice("--scorer", scorer, SCORERS), iou=iou, bbox_space=_choice("--bbox-space", bbox_space, BBOX_SPACES),
        )
        bar = ProgressBar(unit="timed runs")
        try:
            report = run_bench(options, progress=bar, say=render_note if not bar.live else (lambda text: None))
        finally:
            bar.stop()
        code = apply_gates(report, fail_if_slower, fail_on_cache_off, fail_if_less_accurate)
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


@command(cls=Command, epilog="Exit codes: 0 ok · 2 unreadable results or manifest.")
def score(
    results: Annotated[Path, typer.Argument(help="A results JSONL written by vlmfast infer.", show_default=False)],
    manifest: Annotated[str, typer.Option(help="The manifest with ground truth (solution / answer, optional scorer per row).")],
    scorer: Scorer = "auto",
    iou: Iou = 0.5,
    bbox_space: BboxSpace = "resized",
    out: Annotated[Optional[Path], typer.Option(help="Also write the rescored rows here (JSONL).")] = None,
    json_out: Json = False,
):
    """Score an existing results file against a manifest's ground truth — no model, no GPU."""

    def run():
        from .report import print_json, render_scores
        from .scoring import BBOX_SPACES, SCORERS
        from .rescore import rescore_file

        summary = rescore_file(results, manifest, scorer=_choice("--scorer", scorer, SCORERS), iou=iou,
                               bbox_space=_choice("--bbox-space", bbox_space, BBOX_SPACES), out=out)
        render_scores(str(results), summary)
        if json_out:
            print_json(summary)

    _guarded(run)


@command(cls=Command, epilog="Exit codes: 0 written · 2 unreadable or bad records (all listed; nothing written).")
def convert(
    source: Annotated[Path, typer.Argument(help="A VLM-R1 REC/test JSON(L) or an ms-swift dataset JSONL.", show_default=False)],
    out: Annotated[Path, typer.Option(help="Manifest to write (JSONL).")],
    format_: Annotated[str, typer.Option("--format", help="auto | vlmr1 | swift")] = "auto",
    image_root: Annotated[Optional[str], typer.Option(help="Directory the records' relative image paths are under.")] = None,
):
    """Turn a GRPO dataset file into a vlmfast manifest with ground truth (for infer, bench and score)."""

    def run():
        from .convert import FORMATS, convert_file, write_manifest
        from .report import stderr

        rows = convert_file(str(source), _choice("--format", format_, FORMATS), image_root=image_root)
        path = write_manifest(rows, str(out))
        stderr.print(f"wrote {len(rows)} record(s) to {path}", markup=False)
        typer.echo(str(path))

    _guarded(run)


@command(cls=Command, epilog="Exit codes: 0 ok (or findings without --strict) · 1 error-level findings with --strict · 2 bad checkpoint path.")
def doctor(
    ckpt: Annotated[str, typer.Argument(help="Checkpoint dir or trainer output dir.", show_default=False)],
    base: Annotated[Optional[str], typer.Option(help="Base model dir to compare EOS list, vocabulary and files with.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the findings as one JSON object on stdout.")] = False,
    strict: Annotated[bool, typer.Option("--strict", help="Exit 1 on any error-level finding (for CI).")] = False,
):
    """Diagnose a trained checkpoint: cache off, lost EOS or processor files, unmerged shards, LoRA, unsafe weights."""

    def run():
        from .doctor import diagnose, findings_as_dicts, strict_exit_code
        from .locate import locate
        from .report import print_json, render_findings

        where = str(locate(ckpt).path)
        findings = diagnose(ckpt, base=base)
        if json_out:
            print_json({"checkpoint": where, "base": base, "findings": findings_as_dicts(findings)})
        render_findings(where, findings)
        if strict and (code := strict_exit_code(findings)):
            raise typer.Exit(code)

    _guarded(run)


@command(cls=Command, epilog="Exit codes: 0 fixed, or nothing to fix · 2 bad path, read-only dir or hub id (nothing written).")
def fix(
    ckpt: Annotated[str, typer.Argument(help="Checkpoint dir to repair in place (backups: *.orig).", show_default=False)],
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
            stderr.print(f"merged {ckpt} into {result.out_dir} (base {result.base})", markup=False)
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
            stderr.print(f"fixed: {change}", markup=False)
        for backup in result.backups:
            stderr.print(f"backup: {backup}", markup=False)

    _guarded(run)


@command("make-checkpoint", cls=Command)
def make_checkpoint(
    out: Annotated[Path, typer.Argument(help="Directory to write the checkpoint into.", show_default=False)],
    preset: Annotated[str, typer.Option(help="tiny (tests) | demo (~6M params, cache-off cost visible on a CPU) | 3b | 7b (the real shapes; GPU benchmarks)")] = "tiny",
    like: Annotated[str, typer.Option(help="grpo (use_cache false everywhere, as trainers save) | base")] = "grpo",
    seed: Annotated[int, typer.Option(help="Weight seed.")] = 0,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an existing directory.")] = False,
):
    """Build a random-weight Qwen2.5-VL checkpoint offline (real model class and processor)."""

    def run():
        from .report import stderr
        from .tiny import build_checkpoint

        try:
            path = build_checkpoint(out, preset=preset, like=like, seed=seed, overwrite=overwrite)
        except ValueError as exc:
            raise UsageError(str(exc), hint="see vlmfast make-checkpoint --help") from None
        stderr.print(f"checkpoint ({preset}, like {like}) in {path}", markup=False)
        typer.echo(str(path))

    _guarded(run)


@command("make-images", cls=Command)
def make_images(
    out: Annotated[Path, typer.Argument(help="Directory to write PNGs into.", show_default=False)],
    count: Annotated[int, typer.Option("-n", "--count", min=1, help="How many images.")] = 8,
    seed: Annotated[int, typer.Option(help="Content seed.")] = 0,
    size: Annotated[Optional[int], typer.Option(min=28, help="Square side in pixels (default: a mix of small sizes).")] = None,
):
    """Write deterministic sample images (for demos and benchmarks)."""

    def run():
        from .tiny import make_images as make

        for path in make(out, n=count, seed=seed, sizes=[(size, size)] if size else None):
            typer.echo(str(path))

    _guarded(run)


@command(cls=Command)
def demo(
    workdir: Annotated[Optional[Path], typer.Option(help="Where to build the demo checkpoint and images (reused).")] = None,
    max_new_tokens: MaxNew = 64,
    batch_size: Annotated[int, typer.Option(min=1, help="Samples per batch.", rich_help_panel=GEN)] = 8,
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
