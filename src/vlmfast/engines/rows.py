"""What a run produces, the same for every engine: generation settings, one result row per request,
one timing per batch — and the two ways a row is made: from generated token ids (:func:`result_row`)
or from an input that could not run (:func:`error_row`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from vlmfast.declared import GEN, check_types, option
from vlmfast.inputs.requests import Request
from vlmfast.evaluation.scoring import parse_reasoning


# The smallest sampling temperature: logits divided by less overflow float32 to inf (vLLM's _SAMPLING_EPS)
MIN_TEMPERATURE = 1e-5


@dataclass(frozen=True)
class GenerationSettings:
    """How to decode. ``temperature == 0`` means greedy (the default)."""

    max_new_tokens: int = option(1024, help="Cap on new tokens per sample.", panel=GEN)
    temperature: float = option(0.0, help="0 = greedy (default).", panel=GEN)
    top_p: float = option(1.0, help="Nucleus sampling (with --temperature > 0).", panel=GEN)
    seed: int | None = option(None, help="Random seed (sampling).", panel=GEN)
    ignore_eos: bool = option(False, help="Always decode --max-new-tokens (benchmarks).", panel=GEN)
    # answers per request: the prompt is prefilled once, its KV cache copied to n decode rows
    n: int = option(1, help="Answers per request (sampled: add --temperature). The prompt is prefilled once; rows gain "
                    "\"sample\" 0…n−1; --batch-size counts answers.", panel=GEN)
    repetition_penalty: float | None = option(
        None, help="Repetition penalty over each request's prompt and answer (1.0: none). Default: the checkpoint's "
        "generation config (Qwen2-VL/2.5-VL Instruct: 1.05), as plain generate and vLLM apply it.", panel=GEN)

    def __post_init__(self):
        from vlmfast.errors import UsageError

        check_types(self)
        if self.n < 1:
            raise UsageError(f"--n {self.n}: expected at least 1 answer per request", hint="e.g. --n 8 --temperature 1.0")
        if self.max_new_tokens < 1:
            raise UsageError(f"--max-new-tokens {self.max_new_tokens}: expected at least 1", hint="e.g. --max-new-tokens 256")
        if not (self.temperature == 0 or MIN_TEMPERATURE <= self.temperature < float("inf")):  # NaN fails both
            said = (f"below {MIN_TEMPERATURE:g} the scores divided by it overflow (vLLM samples greedily there)"
                    if 0 < self.temperature < MIN_TEMPERATURE else "expected 0 (greedy) or a positive finite number")
            raise UsageError(f"--temperature {self.temperature}: {said}", hint="give 0 for greedy, or e.g. --temperature 0.7")
        if not 0 < self.top_p <= 1:
            raise UsageError(f"--top-p {self.top_p}: expected a value in (0, 1]", hint="e.g. --top-p 0.95")
        if self.repetition_penalty is not None and not 0 < self.repetition_penalty < float("inf"):
            raise UsageError(f"--repetition-penalty {self.repetition_penalty}: expected a finite number above 0 (1.0: none)",
                             hint="e.g. --repetition-penalty 1.05")
        if self.seed is not None and not 0 <= self.seed < 2 ** 63:  # torch's seeds are 64-bit integers
            raise UsageError(f"--seed {self.seed}: expected a whole number from 0 to 2^63 − 1", hint="e.g. --seed 1234")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass
class SampleResult:
    """One output row. ``error`` is set (and the rest empty) for inputs that could not run."""

    id: str
    images: list[str]
    prompt: str
    text: str | None = None
    think: str | None = None
    answer: str | None = None
    finish_reason: str | None = None  # "eos" | "length"
    n_prompt_tokens: int = 0
    n_image_tokens: int = 0
    n_new_tokens: int = 0
    error: str | None = None
    image_sizes: list[list[int]] | None = None  # [width, height] of each image as given
    model_image_sizes: list[list[int]] | None = None  # [width, height] the model saw (after resizing)
    image_grid_thw: list[list[int]] | None = None  # the processor's [t, h, w] patch grid of each image
    bbox_space: str | None = None  # where the model family puts box coordinates (vlmfast.evaluation.scoring.BBOX_SPACES)
    sample: int | None = None  # which of the request's n answers (0…n−1); None when one answer per request
    token_ids: list[int] = field(default_factory=list, repr=False)  # generated ids, EOS included
    extra: dict = field(default_factory=dict, repr=False)  # more row fields (scores), written after the rest
    # a greedy --n answer the engine did not decode: sample 0's tokens given to another sample (plain generate,
    # vLLM); the row is written, its tokens are not counted as generated (new_tokens, tokens/s, row utilization)
    copied: bool = field(default=False, repr=False)

    RECORD_FIELDS = (
        "id", "images", "prompt", "text", "think", "answer", "finish_reason",
        "n_prompt_tokens", "n_image_tokens", "n_new_tokens", "error", "image_sizes", "model_image_sizes", "image_grid_thw",
        "bbox_space",
    )

    def record(self) -> dict:
        """The JSONL row (token ids stay in memory; ``sample`` only with several answers per request)."""
        row = {name: getattr(self, name) for name in self.RECORD_FIELDS}
        if self.sample is not None:
            row["sample"] = self.sample
        return {**row, **self.extra}

    @property
    def key(self) -> str:
        return row_key(self.id, self.sample)


def run_seed(seed: int | None) -> int:
    """The seed a run's draws derive from: ``--seed``, or (none given) one drawn for this run. Every engine
    takes its seed here."""
    import secrets

    return seed if seed is not None else secrets.randbits(31)


def draw_key(seed: int, request_id: str, sample: int = 0) -> int:
    """The 32-bit key of one answer's draws, for every engine: (run seed, request id, sample index) → the
    same draws whatever the batch, the order, a resume or the checkpoint the engine held before."""
    import zlib

    return zlib.crc32(f"{seed}\x00{request_id}\x00{sample}".encode("utf-8"))


def row_key(rid, sample=None) -> str:
    """What identifies a row in a results file (resume, order): its id, and its sample when there are several."""
    return str(rid) if sample is None else f"{rid}\x00{sample}"


def of_samples(rows: list[SampleResult], n: int) -> list[SampleResult]:
    """Rows of a run with ``n`` answers per request: a request's error row stands for each of its n samples
    (so a resume sees the request done); rows that already carry a sample are kept as they are."""
    if n == 1:
        return rows
    import dataclasses

    out = []
    for r in rows:
        out += [dataclasses.replace(r, sample=k) for k in range(n)] if r.sample is None else [r]
    return out


@dataclass(frozen=True)
class BatchTiming:
    size: int
    preprocess_s: float  # all preprocessing work for the batch (image decode/resize, template, processor)
    ttft_s: float  # prefill: vision tower + prompt + choosing the first token
    decode_s: float  # first new token → last new token
    steps: int  # decode steps taken (new tokens per sequence, incl. the first)
    new_tokens: int  # tokens kept across the batch (up to each sequence's EOS)
    step_times_s: tuple[float, ...] = ()  # latency of each decode step after the first token, when recorded
    preprocess_exposed_s: float | None = None  # the part the model waited for (the rest overlapped decode)
    vision_s: float | None = None  # the vision tower's share of the prefill
    cache_fill_s: float | None = None  # the prefill caches copied into decode rows (after the first token)
    syncs: int = 0  # device read-backs during decode
    row_steps: int = 0  # decode rows computed, summed over steps (the first token's step included)
    first_rows: int | None = None  # of row_steps, the rows whose first token prefill chose (None: every row, once)

    @property
    def decode_row_steps(self) -> float:
        """Rows computed by the decode steps proper (after each answer's first token): ``row_steps`` less the
        first tokens. In a static batch every row starts at once: ``row_steps / steps`` of them."""
        first = self.first_rows if self.first_rows is not None else (self.row_steps / self.steps if self.steps else 0)
        return max(self.row_steps - first, 0)


def result_row(request: Request, new_ids: list[int], *, eos_ids, tokenizer, n_prompt: int, n_image: int,
               model_sizes: list[list[int]] | None, sample: int | None = None,
               bbox_space: str | None = None, patch_size: int | None = None) -> SampleResult:
    """The row of one finished request: ids cut after the first EOS (kept, as generate keeps it), text
    decoded by the checkpoint's tokenizer without special tokens, think/answer parsed from the text, each
    image's patch grid from its model size and the processor's ``patch_size`` (:func:`image_grids`)."""
    eos = set(eos_ids)
    end = next((i + 1 for i, t in enumerate(new_ids) if t in eos), None)
    kept = list(new_ids if end is None else new_ids[:end])
    text = tokenizer.decode(kept, skip_special_tokens=True)
    think, answer = parse_reasoning(text)
    return SampleResult(
        id=request.id, images=list(request.images), prompt=request.prompt, text=text, think=think, answer=answer,
        finish_reason="eos" if end is not None else "length", n_prompt_tokens=n_prompt, n_image_tokens=n_image,
        n_new_tokens=len(kept), token_ids=kept,
        image_sizes=[list(s) for s in request.image_sizes] if request.image_sizes else None,
        model_image_sizes=model_sizes, image_grid_thw=image_grids(model_sizes, patch_size), sample=sample,
        bbox_space=bbox_space,
    )


def image_grids(model_sizes: list[list[int]] | None, patch_size: int | None) -> list[list[int]] | None:
    """Each image's ``[t, h, w]`` patch grid as the Qwen image processor gives it (``image_grid_thw``) for the
    ``[width, height]`` it resized the image to: one temporal patch (an image's frame is repeated to the
    temporal patch size), height and width over ``patch_size`` (14: Qwen2/2.5-VL; 16: Qwen3-VL, Qwen3.5).
    None without sizes or a patch size."""
    if not model_sizes or not patch_size:
        return None
    return [[1, int(height) // patch_size, int(width) // patch_size] for width, height in model_sizes]


def error_row(rid: str, request: Request | None, error: str) -> SampleResult:
    """The row of a request that could not run (``request`` None: the input never became a request)."""
    return SampleResult(rid, list(request.images) if request else [], request.prompt if request else "", error=error)
