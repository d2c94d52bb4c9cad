"""``vlmfast bench``'s options, checked once: :class:`BenchOptions` (infer's options it shares are infer's
fields, by reference: :func:`vlmfast.declared.like`). Kept apart from :mod:`vlmfast.run.bench` so the
command line builds ``--help`` from these fields without importing the bench itself."""

from __future__ import annotations

from dataclasses import dataclass

from vlmfast.checkpoints.runtime_choices import check_runtime_choices
from vlmfast.declared import FAST, GATES, GEN, INPUT, MODEL, check_types, like, nested, option
from vlmfast.engines.hf import DECODERS, check_decoder
from vlmfast.engines.open import ENGINES
from vlmfast.engines.rows import GenerationSettings
from vlmfast.engines.prepare import RESIZE_RULES
from vlmfast.errors import UsageError, check_choice
from vlmfast.inputs.requests import TEMPLATES
from vlmfast.evaluation.scoring import BBOX_SPACES, SCORERS
from vlmfast.run.options import InferOptions


@dataclass
class BenchOptions:
    """What ``vlmfast bench`` runs, checked once here (a UsageError with a hint) before anything loads.
    ``batch_sizes`` and ``engines`` may also be given as comma-separated text ("1,8", "hf,vllm").
    ``bbox_space`` None: each row's own, else ``resized`` (see :func:`vlmfast.evaluation.scoring.row_bbox_space`).
    The gates (exit codes 3, 4, 5) are evaluated by :func:`run_bench` into ``report["gates"]``."""

    ckpt: str = like(InferOptions, "ckpt")
    compare_base: str | None = option(None, help="Base model (dir or hub id) run on the same workload.", panel=MODEL)
    images: list[str] | None = like(InferOptions, "images")
    manifest: str | None = like(InferOptions, "manifest")
    image_root: str | None = like(InferOptions, "image_root")
    synthetic: int | None = option(None, help="Generate N synthetic images as the workload.", panel=INPUT)
    synthetic_size: int = option(224, help="Side of synthetic images in pixels.", panel=INPUT)
    prompt: str | None = like(InferOptions, "prompt", help='Prompt for every image (default here: "Describe this image."; '
                              "a manifest's records keep their own).")
    template: str = like(InferOptions, "template")
    max_pixels: int | None = like(InferOptions, "max_pixels")
    min_pixels: int | None = like(InferOptions, "min_pixels")
    resize_rule: str = like(InferOptions, "resize_rule", help=(  # bench has no --match-training
        "How --min-pixels/--max-pixels resize an image: qwen (Qwen's smart_resize within them, as qwen-vl-utils, "
        "ms-swift, VLM-R1 and TRL) | easyr1 (EasyR1's data.min_pixels/max_pixels: the image is scaled into them, then "
        "the processor resizes it within its own limits)."))
    generation: GenerationSettings = nested(lambda: GenerationSettings(max_new_tokens=128))
    batch_sizes: tuple[int, ...] | str = option("8", help="Comma-separated batch sizes for ckpt (and base), e.g. 1,8.",
                                                panel=GEN, type=str)
    warmup: int = option(1, help="Untimed runs per scenario.", panel=GEN)
    repeats: int = option(3, help="Timed runs per scenario (medians reported).", panel=GEN)
    decoder: str = like(InferOptions, "decoder")
    cuda_graphs: bool | None = like(InferOptions, "cuda_graphs")
    # ckpt and base: torch.compile the decode step and, on CUDA, the vision blocks (the warm-up runs compile)
    compile: bool = option(False, help="ckpt and base: torch.compile the decode step and, on CUDA, the vision blocks "
                           "(compiled in the warm-up runs).",
                           panel=FAST, flag="--compile/--no-compile")
    engines: tuple[str, ...] | str = option(
        "hf", help="Engines for ckpt, comma-separated: hf, vllm (hf,vllm: side by side, with token agreement).",
        panel=MODEL, type=str)
    as_saved: bool = option(True, help="Also run plain HF generate with the saved config (slow when the cache is off).",
                            panel=GEN)
    device: str | None = like(InferOptions, "device")
    dtype: str | None = like(InferOptions, "dtype")
    attn: str | None = like(InferOptions, "attn")
    scorer: str = like(InferOptions, "scorer")
    iou: float = like(InferOptions, "iou")
    bbox_space: str | None = like(InferOptions, "bbox_space")
    fail_if_slower: float | None = option(None, help="Exit 3 when ckpt tokens/s < base tokens/s ÷ X.", panel=GATES)
    fail_on_cache_off: bool = option(False, help="Exit 4 when the saved config turns the cache off anywhere.",
                                     panel=GATES)
    fail_if_less_accurate: float | None = option(
        None, help="Exit 5 when ckpt accuracy < base accuracy − X (needs ground truth in --manifest).", panel=GATES)

    def __post_init__(self):
        from vlmfast.run.options import check_image_root, check_iou

        check_types(self)
        check_runtime_choices(self.device, self.dtype, self.attn)
        check_image_root(self.image_root)
        check_iou(self.iou)
        self.batch_sizes = _batch_sizes(self.batch_sizes)
        self.engines = _engines(self.engines)
        if self.synthetic is not None and self.synthetic < 1:
            raise UsageError(f"--synthetic {self.synthetic}: expected at least 1 image", hint="e.g. --synthetic 8")
        if self.synthetic_size < 1:
            raise UsageError(f"--synthetic-size {self.synthetic_size}: expected a side of at least 1 pixel",
                             hint="e.g. --synthetic-size 448")
        if not (self.images or self.manifest or self.synthetic):
            raise UsageError("no workload", hint="give --images, --manifest or --synthetic N")
        if self.warmup < 0 or self.repeats < 1:
            raise UsageError(f"--warmup {self.warmup} --repeats {self.repeats}: need 0 or more warm-up runs and 1 or "
                             "more timed runs", hint="e.g. --warmup 1 --repeats 3")
        if self.compile and self.warmup < 1:
            raise UsageError("--compile needs a warm-up run to compile outside the clock", hint="use --warmup 1 or more")
        choices = [("--decoder", self.decoder, DECODERS), ("--scorer", self.scorer, SCORERS),
                   ("--template", self.template, tuple(TEMPLATES)), ("--resize-rule", self.resize_rule, RESIZE_RULES)]
        for option, value, known in choices + ([("--bbox-space", self.bbox_space, BBOX_SPACES)] if self.bbox_space is not None else []):
            check_choice(option, value, known)
        check_decoder(self.decoder, self.compile, self.cuda_graphs)
        self._check_gates()

    def _check_gates(self) -> None:
        if (self.fail_if_slower is not None or self.fail_if_less_accurate is not None) and not self.compare_base:
            raise UsageError("--fail-if-slower and --fail-if-less-accurate compare with the base", hint="add --compare-base BASE")
        if self.fail_if_slower is not None and not 1 <= self.fail_if_slower < float("inf"):  # NaN: a gate that never trips
            raise UsageError(f"--fail-if-slower {self.fail_if_slower}: expected a finite number of 1 or more (below 1 "
                             "it would demand ckpt beat the base)",
                             hint="X ≥ 1: exit 3 when ckpt tokens/s < base tokens/s ÷ X; 1 means no slower than the base")
        if self.fail_if_less_accurate is not None and not 0 <= self.fail_if_less_accurate <= 1:
            raise UsageError(f"--fail-if-less-accurate {self.fail_if_less_accurate}: an accuracy drop is between 0 and 1",
                             hint="e.g. --fail-if-less-accurate 0.02 (two points)")
        if self.fail_if_less_accurate is not None and not self.manifest:
            raise UsageError("--fail-if-less-accurate needs ground truth", hint="give --manifest with a solution/answer per record")


def _batch_sizes(value) -> tuple[int, ...]:
    items = [x.strip() for x in value.split(",") if x.strip()] if isinstance(value, str) else list(value)
    sizes = [int(x) for x in items if (isinstance(x, str) and x.isdigit()) or (isinstance(x, int) and not isinstance(x, bool))]
    if not items or len(sizes) != len(items) or min(sizes) < 1:
        raise UsageError(f"--batch-sizes {value!r}: expected positive integers", hint="e.g. --batch-sizes 1,8")
    return tuple(dict.fromkeys(sizes))  # a size twice would run and key the same scenario twice


def _engines(value) -> tuple[str, ...]:
    names = [e.strip() for e in value.split(",") if e.strip()] if isinstance(value, str) else list(value)
    if not names or any(e not in ENGINES for e in names):
        raise UsageError(f"--engines {value!r}: expected engines among {', '.join(ENGINES)}, comma-separated",
                         hint="e.g. --engines hf,vllm")
    return tuple(dict.fromkeys(names))
