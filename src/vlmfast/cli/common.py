"""What every command shares: the Typer app and its help style, the option declarations (each declared
once, reused by every command that takes it), the error rendering, and the builder that turns a command's
parameters into the library's options dataclasses by field name (no hand copying)."""

from __future__ import annotations

import dataclasses
from pathlib import Path  # noqa: F401 - used in the option aliases' annotations
from typing import Annotated, Optional

import typer
from typer.core import TyperArgument, TyperCommand, TyperGroup

from vlmfast.errors import EXIT_INTERRUPTED, UsageError, VlmfastError, check_choice

EXIT_CODES_HELP = """Exit codes: 0 ok · 1 unexpected failure · 2 bad input, options or checkpoint (nothing written) ·
3 bench --fail-if-slower tripped · 4 bench --fail-on-cache-off tripped · 5 bench --fail-if-less-accurate or
sweep --fail-if-best-below tripped · 130 interrupted (rerun to resume)."""


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
        _plain_metavars(self, ctx)
        super().format_help(ctx, formatter)


class Group(TyperGroup):
    """The top level's help in the same style (``--version`` without a type label)."""

    def format_help(self, ctx, formatter) -> None:
        _plain_metavars(self, ctx)
        super().format_help(ctx, formatter)


def _plain_metavars(command, ctx) -> None:
    for param in command.get_params(ctx):
        if getattr(param, "is_flag", False) and param.metavar is None:  # --help and every on/off option
            param.metavar = ""
        elif isinstance(param, TyperArgument) and param.metavar is None:
            param.metavar = param.name.upper()


app = typer.Typer(
    cls=Group,
    name="vlmfast",
    help="Fast, honest inference for GRPO-trained vision-language checkpoints (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3.5).",
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
AllowMissing = Annotated[Optional[list[str]], typer.Option("--allow-missing", help="Run a checkpoint that lacks tensors its model class expects when they are under these prefixes (e.g. visual.blocks.1, lm_head); they are initialised at random. Without it such a checkpoint is refused (exit 2).", rich_help_panel=MODEL)]
Fingerprint = Annotated[str, typer.Option(help="The evaluated weights' fingerprint in the report: sampled (safetensors headers and sampled bytes of every tensor) | full (every byte).", rich_help_panel=MODEL)]
AllowPickle = Annotated[bool, typer.Option("--allow-pickle", help="Load pickle (*.bin) weights, which can run code (default: safetensors only).", rich_help_panel=MODEL)]
Engine = Annotated[str, typer.Option(help="hf (vlmfast's engine on transformers) | vllm (vLLM, for many GPUs and big evals).", rich_help_panel=MODEL)]
MaxImagePixels = Annotated[int, typer.Option(help="Refuse images with more pixels than this (decompression bombs).", rich_help_panel=INPUT)]
MaxBatchTokens = Annotated[Optional[int], typer.Option(help="Padded prompt tokens through the model at once (prefill: rows × widest prompt; default CPU 2048, CUDA 32768). --decoder hf: caps whole batches.", rich_help_panel=GEN)]
Images = Annotated[Optional[list[str]], typer.Option("--images", help="Image files, directories or globs (repeat or list after one flag).", rich_help_panel=INPUT)]
Prompt = Annotated[Optional[str], typer.Option(help="Prompt applied to every image.", rich_help_panel=INPUT)]
PromptFile = Annotated[Optional[str], typer.Option(help="File holding the prompt for every image.", rich_help_panel=INPUT)]
Manifest = Annotated[Optional[str], typer.Option(help='JSONL, one request per line: {"id", "image"|"images", "prompt", "system", "solution", "scorer"}, ms-swift {"messages", "images"}, R1-V {"image_path", "question", "ground_truth"} or VLM-R1 {"image", "conversations"}; or a trainer\'s dataset as it is: a .parquet file, a folder of parquet shards or a datasets save_to_disk folder (EasyR1 / verl layouts, images embedded as bytes; needs pyarrow: the parquet extra).', rich_help_panel=INPUT)]
PromptKey = Annotated[Optional[str], typer.Option(help="Parquet/Arrow --manifest: the prompt column (default: problem, as EasyR1; else verl's prompt chat messages).", rich_help_panel=INPUT)]
AnswerKey = Annotated[Optional[str], typer.Option(help="Parquet/Arrow --manifest: the ground-truth column, dotted into a struct (default: answer, as EasyR1; else reward_model.ground_truth, as verl; else solution).", rich_help_panel=INPUT)]
ImageKey = Annotated[Optional[str], typer.Option(help="Parquet/Arrow --manifest: the image column, bytes or paths (default: images, else image).", rich_help_panel=INPUT)]
Template = Annotated[str, typer.Option(help="plain | r1 (append VLM-R1's think/answer instruction).", rich_help_panel=INPUT)]
FormatPrompt = Annotated[Optional[str], typer.Option(help="A Jinja file each prompt is rendered through, with the question as {{ content }}: EasyR1's data.format_prompt (e.g. its math.jinja), so the prompts are the training's (instead of --template).", rich_help_panel=INPUT)]
System = Annotated[Optional[str], typer.Option(help="System prompt.", rich_help_panel=INPUT)]
MaxPixels = Annotated[Optional[int], typer.Option(help="Max pixels per image (default: the processor's, capped at 1280·28·28).", rich_help_panel=INPUT)]
MinPixels = Annotated[Optional[int], typer.Option(help="Min pixels per image (default: the processor's).", rich_help_panel=INPUT)]
SkipBad = Annotated[bool, typer.Option("--skip-bad", help="Record an error row per bad input and run the rest (default: fail before loading).", rich_help_panel=INPUT)]
AutoBatchSize = Annotated[str, typer.Option(help="Samples per batch, or auto (CUDA: from free memory; CPU: 32). Batches are formed by cost.", rich_help_panel=GEN)]
MaxNew = Annotated[int, typer.Option(help="Cap on new tokens per sample.", rich_help_panel=GEN)]
Temperature = Annotated[float, typer.Option(help="0 = greedy (default).", rich_help_panel=GEN)]
TopP = Annotated[float, typer.Option(help="Nucleus sampling (with --temperature > 0).", rich_help_panel=GEN)]
Seed = Annotated[Optional[int], typer.Option(help="Random seed (sampling).", rich_help_panel=GEN)]
Samples = Annotated[int, typer.Option("--n", help="Answers per request (sampled: add --temperature). The prompt is prefilled once; rows gain \"sample\" 0…n−1; --batch-size counts answers.", rich_help_panel=GEN)]
IgnoreEos = Annotated[bool, typer.Option("--ignore-eos", help="Always decode --max-new-tokens (benchmarks).", rich_help_panel=GEN)]
Decoder = Annotated[str, typer.Option(help="vlmfast (its own decode loop) | hf (plain model.generate: the reference).", rich_help_panel=FAST)]
Batching = Annotated[str, typer.Option(help="continuous (a decode row whose answer ended takes the next request at once; default) | static (each batch runs until its longest answer ends). vlmfast's decoder only.", rich_help_panel=FAST)]
CudaGraphs = Annotated[Optional[bool], typer.Option("--cuda-graphs/--no-cuda-graphs", help="Replay the decode step from CUDA graphs (default: on CUDA).", rich_help_panel=FAST)]
Compile = Annotated[Optional[bool], typer.Option("--compile/--no-compile", help="torch.compile the decode step (default: decided after the first batch by what it would save; cached per machine).", rich_help_panel=FAST)]
Overlap = Annotated[Optional[bool], typer.Option("--overlap/--no-overlap", help="Prepare the next batch while this one generates (default: on CUDA; on a CPU it competes for the cores).", rich_help_panel=FAST)]
Scorer = Annotated[str, typer.Option(help="Default scorer for rows with ground truth: auto | exact | number | choice | bbox | contains, or a published evaluation's rules: vlm-r1-rec | easyr1-math | r1v-counting.", rich_help_panel=SCORE)]
Iou = Annotated[float, typer.Option(help="bbox scorer: IoU needed to count as correct.", rich_help_panel=SCORE)]
BboxSpace = Annotated[Optional[str], typer.Option(help="Where predicted boxes live: resized (Qwen2.5-VL: pixels of the resized input) | original (pixels of the image as given) | rel1000 (Qwen2-VL, Qwen3-VL: 0–1000 relative). Default: each row's bbox_space (the model family's), else resized.", rich_help_panel=SCORE)]
Reward = Annotated[Optional[list[str]], typer.Option(help="FILE.py:FUNCTION — score with the trainer's own reward function, called as its trainer calls it (EasyR1 compute_score(reward_inputs) / (reward_input) / ≤0.3 (predict_str, ground_truth), TRL/VLM-R1 f(completions, solution, **kwargs), verl compute_score(data_source, solution_str, ground_truth, extra_info)). Repeat for several: summed with --reward-weights.", rich_help_panel=SCORE)]
RewardWeights = Annotated[Optional[str], typer.Option(help="--reward: one weight per function, comma-separated (e.g. 1,0.5); the total is their weighted sum, as TRL's reward_weights.", rich_help_panel=SCORE)]
RewardKwargs = Annotated[Optional[str], typer.Option(help="--reward: JSON object of keyword arguments bound to every call, as EasyR1's reward_function_kwargs (e.g. '{\"max_response_length\": 4096}').", rich_help_panel=SCORE)]
RewardThreshold = Annotated[float, typer.Option(help="--reward: a row is correct when its reward is at least this (1.0 suits 0/1 rewards); when the reward returns an accuracy (or acc) sub-score, that sub-score is compared.", rich_help_panel=SCORE)]
MatchTraining = Annotated[bool, typer.Option("--match-training", help="Adopt the training's settings found beside the checkpoint (ms-swift args.json, EasyR1 experiment_config.json, verl .hydra/config.yaml): format prompt, pixel limits, max new tokens, validation sampling, reward function; options given on the command line win. The report says what was adopted.", rich_help_panel=GEN)]
Out = Annotated[Optional[str], typer.Option(help="JSONL results file (default: stdout). Rerunning with the same settings skips ids already there (other settings: an error naming them).", rich_help_panel=OUTPUT)]
Overwrite = Annotated[bool, typer.Option("--overwrite", help="Redo ids already in --out.", rich_help_panel=OUTPUT)]
RetryErrors = Annotated[bool, typer.Option("--retry-errors", help="Resume, and redo the ids whose earlier row is an error row.", rich_help_panel=OUTPUT)]
Json = Annotated[bool, typer.Option("--json", help="Print the report as one JSON object on stdout.", rich_help_panel=OUTPUT)]
TensorParallel = Annotated[int, typer.Option(help="--engine vllm: GPUs per model replica (tensor parallel).", rich_help_panel=SCALE)]
DataParallel = Annotated[int, typer.Option(help="--engine vllm: model replicas (vLLM's data parallel).", rich_help_panel=SCALE)]
GpuMemory = Annotated[float, typer.Option(help="--engine vllm: share of GPU memory vLLM may take.", rich_help_panel=SCALE)]
MaxNumSeqs = Annotated[Optional[int], typer.Option(help="--engine vllm: sequences vLLM runs at once (default: vLLM's).", rich_help_panel=SCALE)]
Threads = Annotated[Optional[int], typer.Option(help="Torch's CPU threads (default: this process's share of the cores it may use: the cores ÷ the processes launched beside it).", rich_help_panel=FAST)]
PipelineParallel = Annotated[int, typer.Option(help="--engine vllm: pipeline stages per model replica (across GPUs or nodes).", rich_help_panel=SCALE)]
ExecutorBackend = Annotated[Optional[str], typer.Option(help="--engine vllm: vLLM's distributed executor: mp (one node), ray (a Ray cluster, several nodes).", rich_help_panel=SCALE)]




def _version(value: bool):
    if value:
        from vlmfast import __version__

        typer.echo(f"vlmfast {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True, help="Show the version.")] = False):
    """Fast, honest inference for GRPO-trained vision-language checkpoints."""


def guarded(fn):
    """Render VlmfastErrors once with their hint and exit code; Ctrl-C exits 130 (the runner says what a run
    left on disk; a Ctrl-C that reaches here came before any result was written)."""
    from vlmfast.run.parallel import is_main_process
    from vlmfast.report.terminal import render_error, stderr

    try:
        return fn()
    except VlmfastError as exc:
        if is_main_process():  # every process of a parallel run hits the same input error: say it once
            render_error(exc)
        raise typer.Exit(exc.exit_code) from None
    except KeyboardInterrupt:
        stderr.print("[yellow]interrupted[/yellow] before any result was written; rerun the same command.")
        raise typer.Exit(EXIT_INTERRUPTED) from None


def batch_size_value(value: str) -> int | None:
    if value == "auto":
        return None
    if not (value.isdigit() and int(value) >= 1):
        raise UsageError(f"--batch-size {value}: expected a positive integer or auto", hint="e.g. --batch-size 8")
    return int(value)


def explicit_params(ctx) -> frozenset[str]:
    """The parameters given on the command line (or by environment), not left at their defaults: what
    ``--match-training`` must leave as given."""
    # by the source's name: Typer may bring its own click, whose ParameterSource is another class
    return frozenset(name for name in ctx.params
                     if getattr(ctx.get_parameter_source(name), "name", "DEFAULT") not in ("DEFAULT", "DEFAULT_MAP"))


def from_params(cls, params: dict, **given):
    """``cls`` (an options dataclass) from a command's parameters, field by field: a field takes the
    parameter of its name (or with a trailing underscore, for Python keywords), ``given`` wins, and a field
    that is itself a dataclass is built the same way from the same parameters."""
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name in given:
            kwargs[f.name] = given[f.name]
        elif f.name in params or f"{f.name}_" in params:
            kwargs[f.name] = params[f.name] if f.name in params else params[f"{f.name}_"]
        elif f.name in NESTED:
            kwargs[f.name] = from_params(NESTED[f.name](), params)
    return cls(**kwargs)


def _generation():
    from vlmfast.engines.rows import GenerationSettings

    return GenerationSettings


def _vllm():
    from vlmfast.run.options import VllmSettings

    return VllmSettings


NESTED = {"generation": _generation, "vllm": _vllm}  # option fields that are dataclasses of their own


def choice(option: str, value: str | None, choices) -> str | None:
    """``value`` when it is one of ``choices`` (None passes: the library's default applies)."""
    if value is not None:
        check_choice(option, value, choices)
    return value


def sharing(source, names: tuple[str, ...]):
    """A decorator: the command also takes ``source``'s parameters ``names`` — the same declarations, help
    and defaults, written once (in ``source``). The command receives them in its ``**shared``."""
    import inspect

    def wrap(fn):
        own = [p for p in inspect.signature(fn, eval_str=True).parameters.values() if p.kind is not p.VAR_KEYWORD]
        theirs = inspect.signature(source, eval_str=True).parameters
        params = [*own, *(theirs[name] for name in names)]
        fn.__signature__ = inspect.Signature(params)
        fn.__annotations__ = {p.name: p.annotation for p in params}
        return fn

    return wrap
