"""What a run was asked to do, checked once: :class:`InferOptions` (with :class:`VllmSettings` for
``--engine vllm``). Every check happens in ``__post_init__``, so the CLI and Python callers get the same
errors, before anything loads. Each field that is an option carries its help, panel and flag
(:mod:`vlmfast.declared`): ``vlmfast infer``'s command line is built from these fields."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from vlmfast.checkpoints.runtime_choices import check_runtime_choices
from vlmfast.declared import FAST, GEN, INPUT, MODEL, OUTPUT, SCORE, check_types, nested, option
from vlmfast.engines.hf import BATCHING, DECODERS, check_decoder
from vlmfast.engines.open import ENGINES, check_engine_options
from vlmfast.engines.prepare import RESIZE_RULES
from vlmfast.engines.vllm.support import VllmSettings
from vlmfast.errors import UsageError, check_choice
from vlmfast.evaluation.scoring import OWN_SCORERS, REFERENCE_SCORERS
from vlmfast.files import check_output_file
from vlmfast.inputs.requests import DEFAULT_MAX_IMAGE_PIXELS
from vlmfast.engines.rows import GenerationSettings

MANIFEST_HELP = (
    'JSONL, one request per line: {"id", "image"|"images", "prompt", "system", "solution", "scorer"}, ms-swift '
    '{"messages", "images"}, R1-V {"image_path", "question", "ground_truth"} or VLM-R1 {"image", "conversations"}; '
    "a VLMEvalKit .tsv (base64 images, options A-D, answer); or a trainer's dataset as it is: a .parquet file, a "
    "folder of parquet shards or a datasets save_to_disk folder (EasyR1 / verl layouts, images embedded as bytes; "
    "needs pyarrow: the parquet extra).")
SCORER_HELP = (f"Default scorer for rows with ground truth: {' | '.join(OWN_SCORERS)}, or a published evaluation's "
               f"rules: {' | '.join(REFERENCE_SCORERS)}.")  # read from the registry of scorers
REWARD_HELP = (
    "FILE.py:FUNCTION — score with the trainer's own reward function, called as its trainer calls it (EasyR1 "
    "compute_score(reward_inputs) / (reward_input) / ≤0.3 (predict_str, ground_truth), TRL/VLM-R1 f(completions, "
    "solution, **kwargs), verl compute_score(data_source, solution_str, ground_truth, extra_info)). Repeat for "
    "several: summed with --reward-weights.")


@dataclass(frozen=True)
class InferOptions:
    """``vlmfast infer``'s options (see ``vlmfast infer --help``); invalid combinations raise UsageError."""

    ckpt: str = option(help="Checkpoint dir, trainer output dir (its final save at the top, else the highest "
                       "checkpoint-N with weights) or hub id.", panel=MODEL, flag="--ckpt")
    images: list[str] | None = option(
        None, help="Image files, directories or globs (repeat or list after one flag).", panel=INPUT, flag="--images")
    prompt: str | None = option(None, help="Prompt for every --images file, and for manifest records without one of "
                                "their own.", panel=INPUT)
    prompt_file: str | None = option(None, help="File holding the prompt for every image.", panel=INPUT)
    manifest: str | None = option(None, help=MANIFEST_HELP, panel=INPUT)
    image_root: str | None = option(None, help="The folder a --manifest's relative image paths are under (VLM-R1's "
                                    "--image_folders, EasyR1's data.image_dir; default: the manifest's folder, then the "
                                    "working directory).", panel=INPUT)
    # a parquet / Arrow dataset's columns (None: EasyR1's problem/answer/images, then verl's; vlmfast.inputs.datasets)
    prompt_key: str | None = option(None, help="Parquet/Arrow --manifest: the prompt column (default: problem, as "
                                    "EasyR1; else verl's prompt chat messages).", panel=INPUT)
    answer_key: str | None = option(None, help="Parquet/Arrow --manifest: the ground-truth column, dotted into a "
                                    "struct (default: answer, as EasyR1; else reward_model.ground_truth, as verl; "
                                    "else solution).", panel=INPUT)
    image_key: str | None = option(None, help="Parquet/Arrow --manifest: the image column, bytes or paths (default: "
                                   "images, else image).", panel=INPUT)
    template: str = option("plain", help="plain | r1 (append VLM-R1's think/answer instruction) | rec (the same and "
                           "its REC tasks' \"Output the final answer in JSON format.\").", panel=INPUT)
    format_prompt: str | None = option(
        None, help="A Jinja file each prompt is rendered through, with the question as {{ content }}: EasyR1's "
        "data.format_prompt (e.g. its math.jinja), so the prompts are the training's (instead of --template).",
        panel=INPUT)
    system: str | None = option(None, help="System prompt.", panel=INPUT)
    max_pixels: int | None = option(
        None, help="Max pixels per image (default: the processor's, capped at 1280·28·28).", panel=INPUT)
    min_pixels: int | None = option(None, help="Min pixels per image (default: the processor's).", panel=INPUT)
    resize_rule: str = option("qwen", help="How --min-pixels/--max-pixels resize an image: qwen (Qwen's smart_resize "
                              "within them, as qwen-vl-utils, ms-swift, VLM-R1 and TRL) | easyr1 (EasyR1's data.min_pixels"
                              "/max_pixels: the image is scaled into them, then the processor resizes it within its own "
                              "limits). --match-training picks the trainer's.", panel=INPUT)
    skip_bad: bool = option(False, help="Record an error row per bad input and run the rest (default: fail before "
                            "loading).", panel=INPUT)
    max_image_pixels: int = option(DEFAULT_MAX_IMAGE_PIXELS, help="Refuse images with more pixels than this "
                                   "(decompression bombs).", panel=INPUT)
    # "auto" (None once checked): from free GPU memory; a measured default on a CPU
    batch_size: int | str | None = option(
        "auto", help="Decode rows: answers decoded at once (at least --n), or auto (CUDA: from free memory; CPU: 32). "
        "--batching static: batches formed by cost, of this many answers.",
        panel=GEN, type=str)
    max_batch_tokens: int | None = option(
        None, help="Padded prompt tokens through the model at once (prefill: rows × widest prompt; default CPU 2048, "
        "CUDA 32768). --decoder hf: caps whole batches.", panel=GEN)
    generation: GenerationSettings = nested(GenerationSettings)
    match_training: bool = option(
        False, help="Adopt the training's settings found beside the checkpoint (ms-swift args.json, EasyR1 "
        "experiment_config.json, verl .hydra/config.yaml): format prompt, pixel limits, max new tokens, validation "
        "sampling, reward function; options given on the command line win. The report says what was adopted.",
        panel=GEN)
    decoder: str = option("vlmfast", help="vlmfast (its own decode loop) | hf (plain model.generate: the reference).",
                          panel=FAST)
    batching: str = option("continuous", help="continuous (a decode row whose answer ended takes the next request at "
                           "once; default) | static (each batch runs until its longest answer ends). vlmfast's decoder "
                           "in one process.", panel=FAST)
    cuda_graphs: bool | None = option(None, help="Replay the decode step from CUDA graphs (default: on CUDA).",
                                      panel=FAST)
    compile: bool | None = option(None, help="torch.compile the decode step, and on CUDA the vision blocks (default: "
                                  "decided after the first batch by what it would save; cached per machine).", panel=FAST)
    overlap: bool | None = option(None, help="Prepare the next batch while this one generates (default: on CUDA; on a "
                                  "CPU it competes for the cores).", panel=FAST)
    threads: int | None = option(None, help="Torch's CPU threads (default: this process's share of the cores it may "
                                 "use: the cores ÷ the processes launched beside it).", panel=FAST)
    engine: str = option("hf", help="hf (vlmfast's engine on transformers) | vllm (vLLM, for many GPUs and big evals).",
                         panel=MODEL)
    vllm: VllmSettings = nested(VllmSettings)
    device: str | None = option(None, help="auto | cpu | cuda | cuda:N", panel=MODEL)
    dtype: str | None = option(None, help="auto (CUDA bf16, CPU float32) | bfloat16 | float16 | float32", panel=MODEL)
    attn: str | None = option(None, help="auto (flash_attention_2 when installed, else sdpa) | flash_attention_2 | "
                              "sdpa | eager", panel=MODEL)
    trust_remote_code: bool = option(False, help="Run the checkpoint's own Python code (off by default).", panel=MODEL)
    allow_pickle: bool = option(False, help="Load pickle (*.bin) weights, which can run code (default: safetensors "
                                "only).", panel=MODEL)
    base: str | None = option(None, help="LoRA adapters: the base model (default: the one adapter_config.json names). "
                              "vLLM engine: also where missing processor files come from.", panel=MODEL)
    merge: bool = option(False, help="LoRA adapter checkpoints: merge the adapter into the weights before generating.",
                         panel=MODEL)
    allow_missing: list[str] | None = option(
        None, help="Run a checkpoint that lacks tensors its model class expects when they are under these prefixes "
        "(e.g. visual.blocks.1, lm_head); they are initialised at random. Without it such a checkpoint is refused "
        "(exit 2).", panel=MODEL, flag="--allow-missing", type=list[str])
    fingerprint: str = option("sampled", help="The evaluated weights' fingerprint in the report: sampled (safetensors "
                              "headers and sampled bytes of every tensor) | full (every byte).", panel=MODEL)
    scorer: str = option("auto", help=SCORER_HELP, panel=SCORE)
    iou: float = option(0.5, help="bbox scorer: IoU needed to count as correct.", panel=SCORE)
    bbox_space: str | None = option(
        None, help="Where predicted boxes live: resized (Qwen2.5-VL: pixels of the resized input) | original (pixels "
        "of the image as given) | rel1000 (Qwen2-VL, Qwen3-VL: 0–1000 relative). Default: each row's bbox_space (the "
        "model family's), else resized.", panel=SCORE)
    reward: str | list[str] | None = option(None, help=REWARD_HELP, panel=SCORE, type=list[str])
    reward_weights: str | list[float] | None = option(
        None, help="--reward: one weight per function, comma-separated (e.g. 1,0.5); the total is their weighted "
        "sum, as TRL's reward_weights.", panel=SCORE, type=str)
    reward_kwargs: str | None = option(
        None, help="--reward: JSON object of keyword arguments bound to every call, as EasyR1's "
        "reward_function_kwargs (e.g. '{\"max_response_length\": 4096}').", panel=SCORE)
    reward_threshold: float = option(
        1.0, help="--reward: a row is correct when its reward is at least this (1.0 suits 0/1 rewards); when the reward "
        "returns an accuracy (or acc) sub-score, that sub-score is compared; of several functions, the one named as an "
        "accuracy (accuracy_reward, …).", panel=SCORE)
    out: str | None = option(None, help="JSONL results file (default: stdout). Rerunning with the same settings skips "
                             "ids already there (other settings: an error naming them).", panel=OUTPUT)
    overwrite: bool = option(False, help="Redo ids already in --out.", panel=OUTPUT)
    retry_errors: bool = option(False, help="Resume, and redo the ids whose earlier row is an error row.",
                                panel=OUTPUT)
    # not options: set by whoever builds the options
    explicit: frozenset[str] | None = None  # options given explicitly (None: those that differ from their default)
    rows_to_stdout: bool = False  # without --out, the command line streams rows to stdout; a library call returns them

    def __post_init__(self):
        from vlmfast.inputs.requests import TEMPLATES
        from vlmfast.evaluation.scoring import BBOX_SPACES, SCORERS

        check_types(self)
        check_choice("--engine", self.engine, ENGINES)
        check_choice("--decoder", self.decoder, DECODERS)
        check_decoder(self.decoder, self.compile, self.cuda_graphs)  # here too: a finished resume opens no engine
        check_choice("--batching", self.batching, BATCHING)
        check_choice("--fingerprint", self.fingerprint, ("sampled", "full"))
        check_choice("--scorer", self.scorer, SCORERS)
        check_choice("--template", self.template, tuple(TEMPLATES))
        check_choice("--resize-rule", self.resize_rule, RESIZE_RULES)
        check_image_root(self.image_root)
        if self.format_prompt is not None and self.template != "plain":
            raise UsageError(f"--format-prompt and --template {self.template} both shape the prompt",
                             hint="drop one of them")
        if self.bbox_space is not None:
            check_choice("--bbox-space", self.bbox_space, BBOX_SPACES)
        check_iou(self.iou)
        for flag, value in (("--max-image-pixels", self.max_image_pixels), ("--max-batch-tokens", self.max_batch_tokens),
                            ("--threads", self.threads),
                            ("--max-pixels", self.max_pixels), ("--min-pixels", self.min_pixels)):
            if value is not None and value < 1:
                raise UsageError(f"{flag} {value}: expected a positive number", hint=f"drop {flag} for the default")
        check_threads(self.threads)
        check_runtime_choices(self.device, self.dtype, self.attn)  # the loader's (a finished resume never loads)
        if self.min_pixels is not None and self.max_pixels is not None and self.min_pixels > self.max_pixels:
            raise UsageError(f"--min-pixels {self.min_pixels} > --max-pixels {self.max_pixels}: need min <= max",
                             hint="lower --min-pixels or raise --max-pixels")
        from vlmfast.evaluation.rewards import check_reward_options

        if isinstance(self.reward_weights, (list, tuple)):  # TRL's reward_weights, from Python: one text form
            object.__setattr__(self, "reward_weights", ",".join(repr(float(w)) for w in self.reward_weights))
        # --match-training may take the reward from the trainer's config: its weights and threshold are checked anyway
        check_reward_options(self.reward, weights=self.reward_weights, kwargs=self.reward_kwargs,
                             threshold=self.reward_threshold, reward_may_follow=self.match_training)
        object.__setattr__(self, "batch_size", _batch_size(self.batch_size))
        if self.overwrite and self.retry_errors:
            raise UsageError("--overwrite redoes every id; --retry-errors resumes and redoes only error rows",
                             hint="drop one of them")
        if self.out is not None:
            check_output_file("--out", self.out)
        if (self.overwrite or self.retry_errors) and self.out is None:
            raise UsageError("--overwrite and --retry-errors act on a results file", hint="add --out results.jsonl")
        check_engine_options(self)


def _batch_size(value) -> int | None:
    """``--batch-size``: a positive number, or "auto" / None (the engine's choice: None)."""
    if value is None or value == "auto":
        return None
    number = int(value) if isinstance(value, str) and value.isdigit() else value
    if isinstance(number, bool) or not isinstance(number, int) or number < 1:
        raise UsageError(f"--batch-size {value}: expected a positive integer or auto", hint="e.g. --batch-size 8")
    return number


def check_threads(threads: int | None) -> None:
    """A UsageError when ``--threads`` asks for more threads than this machine has cores (torch and the
    tokenizers' pool would be sized by it)."""
    cores = os.cpu_count()
    if threads is not None and cores is not None and threads > cores:
        raise UsageError(f"--threads {threads}: more than the {cores} cores of this machine",
                         hint=f"give --threads {cores} or fewer, or drop --threads for this process's share of them")


def check_iou(iou: float) -> None:
    """A UsageError when ``--iou`` is no overlap a box can reach (above 1 none counts, below 0 every box does)."""
    if not 0 <= iou <= 1:
        raise UsageError(f"--iou {iou}: expected a value in [0, 1]", hint="e.g. --iou 0.5")


def check_image_root(image_root: str | None) -> None:
    """A UsageError when ``--image-root`` names no folder (else every image would read "file not found")."""
    if image_root is not None and not Path(image_root).is_dir():
        raise UsageError(f"--image-root {image_root}: no such folder",
                         hint="give the folder the manifest's relative image paths are under")
