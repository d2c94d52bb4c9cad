"""Batched generation with the KV cache on, and honest per-phase timing.

Phases per batch: ``preprocess`` (open + resize images, chat template, processor) → ``prefill``
(vision tower + prompt, ending at the first new token: TTFT) → ``decode`` (the remaining tokens).
Clocks synchronize the device before each read (see :mod:`vlmfast.timing`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from .batching import image_tokens, plan_batches
from .checkpoint import Loaded
from .inputs import Request
from .timing import now

DEFAULT_MAX_PIXELS_CAP = 1280 * 28 * 28  # the real default (16384·28·28) OOMs on large images


@dataclass(frozen=True)
class GenerationSettings:
    """How to decode. ``temperature == 0`` means greedy (the default)."""

    max_new_tokens: int = 1024
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    ignore_eos: bool = False  # decode exactly max_new_tokens (benchmarks)

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
    token_ids: list[int] = field(default_factory=list, repr=False)  # generated ids, EOS included

    RECORD_FIELDS = (
        "id", "images", "prompt", "text", "think", "answer", "finish_reason",
        "n_prompt_tokens", "n_image_tokens", "n_new_tokens", "error",
    )

    def record(self) -> dict:
        """The JSONL row (token ids stay in memory)."""
        return {name: getattr(self, name) for name in self.RECORD_FIELDS}


@dataclass(frozen=True)
class BatchTiming:
    size: int
    preprocess_s: float
    ttft_s: float  # generate() start → first new token (vision + prefill + first sampling step)
    decode_s: float  # first new token → last new token
    steps: int  # decode steps taken (new tokens per sequence, incl. the first)
    new_tokens: int  # tokens kept across the batch (up to each sequence's EOS)
    step_times_s: tuple[float, ...] = ()  # latency of each decode step after the first token, when recorded


THINK = re.compile(r"<think>(.*?)(?:</think>|$)", re.DOTALL)
ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def parse_reasoning(text: str) -> tuple[str | None, str | None]:
    """(think, answer) from GRPO-style ``<think>…</think><answer>…</answer>`` output.

    An unclosed ``<think>`` keeps what was thought (truncated runs); a bare ``</think>`` (template
    opened the tag) takes the text before it; an unclosed ``<answer>`` is no answer. Absent → None.
    """
    think = None
    if (m := THINK.search(text)) is not None:
        think = m.group(1).strip()
    elif "</think>" in text:
        think = text.split("</think>", 1)[0].strip()
    answer = m.group(1).strip() if (m := ANSWER.search(text)) is not None else None
    return think, answer


class _StepClock:
    """A logits processor that reads the clock when logits for a new token are ready.

    The first call marks the first token (TTFT). Later calls are recorded only when asked for, since
    each one synchronizes the device."""

    def __init__(self, device, every_step: bool):
        self.device = device
        self.every_step = every_step
        self.times: list[float] = []

    def __call__(self, input_ids, scores):
        if self.every_step or not self.times:
            self.times.append(now(self.device))
        return scores


class Engine:
    """Runs requests through a :class:`~vlmfast.checkpoint.Loaded` model in cost-sorted batches."""

    def __init__(self, loaded: Loaded, settings: GenerationSettings, *, min_pixels: int | None = None,
                 max_pixels: int | None = None, record_steps: bool = False):
        self.loaded = loaded
        self.settings = settings
        self.record_steps = record_steps
        ip = loaded.processor.image_processor
        own_min, own_max = processor_pixel_limits(ip)
        self.min_pixels = min_pixels if min_pixels is not None else own_min
        self.max_pixels = max_pixels if max_pixels is not None else min(own_max, DEFAULT_MAX_PIXELS_CAP)
        self.max_pixels_capped = max_pixels is None and own_max > DEFAULT_MAX_PIXELS_CAP
        self.patch_size = int(getattr(ip, "patch_size", 14))
        self.merge_size = int(getattr(ip, "merge_size", 2))
        self.generate_kwargs = self._generate_kwargs()

    # -- planning ---------------------------------------------------------------------------
    def cost(self, request: Request, image_sizes: dict[str, tuple[int, int]]) -> int:
        """Prefill tokens this request will take (image tokens estimated from the header size)."""
        tokens = len(request.prompt) // 3 + 16  # rough prompt + template tokens; only used for ordering
        for path in request.images:
            w, h = image_sizes.get(path, (448, 448))
            tokens += image_tokens(w, h, min_pixels=self.min_pixels, max_pixels=self.max_pixels,
                                   patch_size=self.patch_size, merge_size=self.merge_size)
        return tokens

    def plan(self, requests: Sequence[Request], image_sizes: dict, batch_size: int) -> list[list[int]]:
        return plan_batches([self.cost(r, image_sizes) for r in requests], batch_size)

    # -- running ----------------------------------------------------------------------------
    def run(self, requests: Sequence[Request], image_sizes: dict, batch_size: int
            ) -> Iterator[tuple[list[int], list[SampleResult], BatchTiming]]:
        """Yield (input indices, results, timing) batch by batch, most expensive batch first."""
        import torch

        if self.settings.seed is not None:
            torch.manual_seed(self.settings.seed)
        for indices in self.plan(requests, image_sizes, batch_size):
            results, timing = self.generate_batch([requests[i] for i in indices])
            yield indices, results, timing

    def preprocess(self, batch: Sequence[Request]):
        """Images opened and resized (Qwen's rule, our pixel limits), chat template applied, tensors built."""
        from qwen_vl_utils import fetch_image

        processor = self.loaded.processor
        texts, images = [], []
        for r in batch:
            content = [{"type": "image", "image": p} for p in r.images] + [{"type": "text", "text": r.prompt}]
            messages = ([{"role": "system", "content": r.system}] if r.system else []) + [{"role": "user", "content": content}]
            texts.append(processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))
            for p in r.images:
                images.append(fetch_image({"image": p, "min_pixels": self.min_pixels, "max_pixels": self.max_pixels},
                                          image_patch_size=self.patch_size))
        inputs = processor(
            text=texts, images=images or None, padding=True, return_tensors="pt",
            size={"shortest_edge": self.min_pixels, "longest_edge": self.max_pixels},
        )
        return inputs.to(self.loaded.model.device)

    def generate_batch(self, batch: Sequence[Request]) -> tuple[list[SampleResult], BatchTiming]:
        device = self.loaded.model.device
        t0 = now(device)
        inputs = self.preprocess(batch)
        if "pixel_values" in inputs:
            inputs["pixel_values"] = inputs["pixel_values"].to(self.loaded.model.dtype)
        clock = _StepClock(device, self.record_steps)
        t1 = now(device)
        output = self.generate(inputs, clock)
        t2 = now(device)

        prompt_len = inputs["input_ids"].shape[1]
        new = output[:, prompt_len:].tolist()
        results = [self._result(r, inputs, row, new[row]) for row, r in enumerate(batch)]
        first = clock.times[0] if clock.times else t2
        steps = len(new[0]) if new else 0
        # decode-step latencies: between consecutive tokens (the first token's wait is the TTFT)
        step_times = tuple(b - a for a, b in zip(clock.times, clock.times[1:])) if self.record_steps else ()
        timing = BatchTiming(
            size=len(batch), preprocess_s=t1 - t0, ttft_s=first - t1, decode_s=t2 - first, steps=steps,
            new_tokens=sum(r.n_new_tokens for r in results), step_times_s=step_times,
        )
        return results, timing

    def generate(self, inputs, clock=None):
        """``model.generate`` with the cache on — the one call every vlmfast path goes through."""
        import torch
        from transformers import LogitsProcessorList

        kwargs = dict(self.generate_kwargs)
        if clock is not None:
            kwargs["logits_processor"] = LogitsProcessorList([clock])
        with torch.inference_mode():
            return self.loaded.model.generate(**inputs, **kwargs)

    def _generate_kwargs(self) -> dict:
        """Arguments over the checkpoint's generation config (repetition penalty etc. kept): the cache
        on, our stop list, suppressed vision placeholders, the decoding mode asked for."""
        s, loaded = self.settings, self.loaded
        kwargs = dict(
            use_cache=True, max_new_tokens=s.max_new_tokens, min_new_tokens=None, max_length=None,
            pad_token_id=loaded.pad_token_id,
            eos_token_id=None if s.ignore_eos else list(loaded.eos_token_ids),
            suppress_tokens=list(loaded.suppress_token_ids) or None,
        )
        if s.greedy:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        else:
            kwargs.update(do_sample=True, temperature=s.temperature, top_p=s.top_p, top_k=None)
        return kwargs

    def _result(self, request: Request, inputs, row: int, new_ids: list[int]) -> SampleResult:
        eos = set() if self.settings.ignore_eos else set(self.loaded.eos_token_ids)
        end = next((i + 1 for i, t in enumerate(new_ids) if t in eos), None)
        kept = new_ids if end is None else new_ids[:end]
        tokenizer = self.loaded.processor.tokenizer
        text = tokenizer.decode(kept, skip_special_tokens=True)
        think, answer = parse_reasoning(text)
        image_id = self.loaded.model.config.image_token_id
        return SampleResult(
            id=request.id, images=list(request.images), prompt=request.prompt, text=text, think=think, answer=answer,
            finish_reason="eos" if end is not None else "length",
            n_prompt_tokens=int(inputs["attention_mask"][row].sum()),
            n_image_tokens=int((inputs["input_ids"][row] == image_id).sum()),
            n_new_tokens=len(kept), token_ids=kept,
        )


def processor_pixel_limits(image_processor) -> tuple[int, int]:
    """(min_pixels, max_pixels) of a Qwen2-VL image processor, across transformers versions."""
    size = getattr(image_processor, "size", None) or {}
    get = size.get if isinstance(size, dict) else lambda k, d=None: getattr(size, k, d)
    lo = get("shortest_edge") or getattr(image_processor, "min_pixels", None) or 56 * 56
    hi = get("longest_edge") or getattr(image_processor, "max_pixels", None) or 16384 * 28 * 28
    return int(lo), int(hi)

