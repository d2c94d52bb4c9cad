"""What a run was asked to do, checked once: :class:`InferOptions` (with :class:`VllmSettings` for
``--engine vllm``). Every check happens in ``__post_init__``, so the CLI and Python callers get the same
errors, before anything loads."""

from __future__ import annotations

from dataclasses import dataclass, field

from vlmfast.engines.hf import BATCHING, DECODERS
from vlmfast.engines.open import ENGINES
from vlmfast.engines.vllm.support import VllmSettings
from vlmfast.errors import UsageError, check_choice
from vlmfast.files import check_output_file
from vlmfast.inputs.requests import DEFAULT_MAX_IMAGE_PIXELS
from vlmfast.engines.rows import GenerationSettings



# (option name, its default, the flag) of settings only vlmfast's own engine has
HF_ONLY = (("device", None, "--device"), ("attn", None, "--attn"), ("decoder", "vlmfast", "--decoder"),
           ("batching", "continuous", "--batching"),
           ("cuda_graphs", None, "--cuda-graphs"), ("compile", None, "--compile"), ("overlap", None, "--overlap"),
           ("max_batch_tokens", None, "--max-batch-tokens"), ("allow_pickle", False, "--allow-pickle"),
           ("threads", None, "--threads"))


@dataclass(frozen=True)
class InferOptions:
    """``vlmfast infer``'s options (see ``vlmfast infer --help``); invalid combinations raise UsageError."""

    ckpt: str
    images: list[str] | None = None
    prompt: str | None = None
    prompt_file: str | None = None
    manifest: str | None = None
    # a parquet / Arrow dataset's columns (None: EasyR1's problem/answer/images, then verl's; vlmfast.inputs.datasets)
    prompt_key: str | None = None
    answer_key: str | None = None
    image_key: str | None = None
    format_prompt: str | None = None  # a Jinja file every prompt is rendered through (EasyR1's data.format_prompt)
    template: str = "plain"
    system: str | None = None
    out: str | None = None
    overwrite: bool = False
    retry_errors: bool = False  # resume: redo ids whose earlier row is an error row
    skip_bad: bool = False
    batch_size: int | None = None  # None: auto (from free GPU memory; a measured default on a CPU)
    generation: GenerationSettings = field(default_factory=GenerationSettings)
    min_pixels: int | None = None
    max_pixels: int | None = None
    device: str | None = None
    dtype: str | None = None
    attn: str | None = None
    trust_remote_code: bool = False
    allow_pickle: bool = False
    allow_missing: list[str] | tuple[str, ...] | None = None  # prefixes of tensors a checkpoint may lack (random)
    fingerprint: str = "sampled"  # the weights' fingerprint: "sampled" (headers + sampled bytes) | "full" (every byte)
    base: str | None = None  # LoRA adapter checkpoints: the base model (default: adapter_config.json's)
    merge: bool = False  # LoRA: merge the adapter into the weights before generating
    max_batch_tokens: int | None = None
    max_image_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS
    overlap: bool | None = None  # prepare the next batch while this one generates (None: on CUDA only)
    decoder: str = "vlmfast"  # "vlmfast" (own decode loop) | "hf" (plain model.generate, the reference)
    batching: str = "continuous"  # "continuous" (a row that ends takes the next request) | "static" (whole batches)
    cuda_graphs: bool | None = None  # None: on CUDA with the vlmfast decoder
    compile: bool | None = None  # None: decided after the first batch, by what the workload would save
    threads: int | None = None  # torch's CPU threads (None: this process's share of the cores it may use)
    scorer: str = "auto"  # default scorer for rows with ground truth and no scorer of their own
    iou: float = 0.5
    bbox_space: str | None = None  # None: each row's own (the model family's convention), else resized
    reward: str | list[str] | None = None  # FILE.py:FUNCTION (one or several): the trainer's reward functions score
    reward_weights: str | None = None  # "1,0.5": one weight per reward function, summed as TRL does
    reward_kwargs: str | None = None  # JSON object bound to every reward call (EasyR1's reward_function_kwargs)
    reward_threshold: float = 1.0  # a rewarded row is correct when its reward is at least this
    engine: str = "hf"  # "hf" (vlmfast's engine on transformers) | "vllm"
    vllm: VllmSettings = field(default_factory=VllmSettings)
    match_training: bool = False  # adopt the training's settings (beside the checkpoint) for those not given
    explicit: frozenset[str] | None = None  # options given explicitly (None: those that differ from their default)
    rows_to_stdout: bool = False  # without --out, the command line streams rows to stdout; a library call returns them

    def __post_init__(self):
        from vlmfast.inputs.requests import TEMPLATES
        from vlmfast.evaluation.scoring import BBOX_SPACES, SCORERS

        check_choice("--engine", self.engine, ENGINES)
        check_choice("--decoder", self.decoder, DECODERS)
        check_choice("--batching", self.batching, BATCHING)
        check_choice("--fingerprint", self.fingerprint, ("sampled", "full"))
        check_choice("--scorer", self.scorer, SCORERS)
        check_choice("--template", self.template, tuple(TEMPLATES))
        if self.format_prompt is not None and self.template != "plain":
            raise UsageError(f"--format-prompt and --template {self.template} both shape the prompt",
                             hint="drop one of them")
        if self.bbox_space is not None:
            check_choice("--bbox-space", self.bbox_space, BBOX_SPACES)
        if not 0 <= self.iou <= 1:
            raise UsageError(f"--iou {self.iou}: expected a value in [0, 1]", hint="e.g. --iou 0.5")
        for flag, value in (("--max-image-pixels", self.max_image_pixels), ("--max-batch-tokens", self.max_batch_tokens),
                            ("--threads", self.threads),
                            ("--max-pixels", self.max_pixels), ("--min-pixels", self.min_pixels)):
            if value is not None and value < 1:
                raise UsageError(f"{flag} {value}: expected a positive number", hint=f"drop {flag} for the default")
        if self.min_pixels is not None and self.max_pixels is not None and self.min_pixels > self.max_pixels:
            raise UsageError(f"--min-pixels {self.min_pixels} > --max-pixels {self.max_pixels}: need min <= max",
                             hint="lower --min-pixels or raise --max-pixels")
        if self.batch_size is not None and self.batch_size < 1:
            raise UsageError(f"--batch-size {self.batch_size}: expected a positive integer or auto", hint="e.g. --batch-size 8")
        if self.overwrite and self.retry_errors:
            raise UsageError("--overwrite redoes every id; --retry-errors resumes and redoes only error rows",
                             hint="drop one of them")
        if self.out is not None:
            check_output_file("--out", self.out)
        if (self.overwrite or self.retry_errors) and self.out is None:
            raise UsageError("--overwrite and --retry-errors act on a results file", hint="add --out results.jsonl")
        if self.engine == "vllm":
            given = [flag for name, default, flag in HF_ONLY if getattr(self, name) not in (default, "auto")]
            if given:
                raise UsageError(f"{', '.join(given)} {'applies' if len(given) == 1 else 'apply'} to vlmfast's own "
                                 "engine (--engine hf), not to --engine vllm",
                                 hint="drop them; vLLM picks its own device, attention and CUDA graphs")
        elif not self.vllm.is_default:
            raise UsageError("--tensor-parallel-size, --data-parallel-size, --gpu-memory-utilization and --max-num-seqs "
                             "apply to --engine vllm",
                             hint="add --engine vllm, or launch several processes with accelerate for the HF engine")
