"""Batched generation with the KV cache on, and honest per-phase timing.

Phases per batch: ``preprocess`` (open + resize images, chat template, processor) → ``prefill``
(vision tower + prompt, ending at the first new token: TTFT) → ``decode`` (the remaining tokens).
Clocks synchronize the device before each read (see :mod:`vlmfast.timing`).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from .batching import image_tokens, plan_batches
from .checkpoint import Loaded
from .errors import InputError, UsageError
from .inputs import Request
from .timing import now

DEFAULT_MAX_PIXELS_CAP = 1280 * 28 * 28  # the real default (16384·28·28) OOMs on large images
COMPILE_LENGTH_BUCKET = 64  # --compile: prompt lengths padded to a multiple of this


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
    preprocess_s: float  # all preprocessing work for the batch (image decode/resize, template, processor)
    ttft_s: float  # generate() start → first new token (vision + prefill + first sampling step)
    decode_s: float  # first new token → last new token
    steps: int  # decode steps taken (new tokens per sequence, incl. the first)
    new_tokens: int  # tokens kept across the batch (up to each sequence's EOS)
    step_times_s: tuple[float, ...] = ()  # latency of each decode step after the first token, when recorded
    preprocess_exposed_s: float | None = None  # the part the model waited for (the rest overlapped decode)


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
                 max_pixels: int | None = None, record_steps: bool = False, overlap: bool | None = None,
                 compile: bool = False):
        self.loaded = loaded
        self.on_cuda = loaded.runtime.device.startswith("cuda")
        # None = auto: overlap on a GPU; on a 2-core CPU it measured no faster (threads share the cores)
        self.overlap = self.on_cuda if overlap is None else overlap
        self.compile = compile
        self.settings = settings
        self.record_steps = record_steps
        ip = loaded.processor.image_processor
        own_min, own_max = processor_pixel_limits(ip)
        self.min_pixels = min_pixels if min_pixels is not None else own_min
        self.max_pixels = max_pixels if max_pixels is not None else min(own_max, DEFAULT_MAX_PIXELS_CAP)
        self.max_pixels_capped = max_pixels is None and own_max > DEFAULT_MAX_PIXELS_CAP
        if not 0 < self.min_pixels <= self.max_pixels:
            raise UsageError(f"pixel limits min {self.min_pixels} / max {self.max_pixels}: need 0 < min <= max",
                             hint="e.g. --min-pixels 3136 --max-pixels 1003520")
        self.patch_size = int(getattr(ip, "patch_size", 14))
        self.merge_size = int(getattr(ip, "merge_size", 2))
        self.generate_kwargs = self._generate_kwargs()
        self.oom_splits = 0  # batches halved after a CUDA out-of-memory error

    # -- planning ---------------------------------------------------------------------------
    def cost(self, request: Request, image_sizes: dict[str, tuple[int, int]]) -> int:
        """Prefill tokens this request will take (image tokens estimated from the header size)."""
        tokens = len(request.prompt) // 3 + 16  # rough prompt + template tokens; only used for ordering
        for path in request.images:
            w, h = image_sizes.get(path, (448, 448))
            tokens += image_tokens(w, h, min_pixels=self.min_pixels, max_pixels=self.max_pixels,
                                   patch_size=self.patch_size, merge_size=self.merge_size)
        return tokens

    def plan(self, requests: Sequence[Request], image_sizes: dict, batch_size: int,
             max_batch_tokens: int | None = None) -> list[list[int]]:
        return plan_batches([self.cost(r, image_sizes) for r in requests], batch_size, max_batch_tokens)

    def context_problems(self, requests: Sequence[Request], image_sizes: dict) -> dict[str, str]:
        """Requests whose prompt (text + image tokens) leaves no room in the model's context, by id."""
        limit = getattr(self.loaded.model.config.get_text_config(), "max_position_embeddings", None)
        if not limit:
            return {}
        tokenizer = self.loaded.processor.tokenizer
        problems = {}
        for r in requests:
            n = len(tokenizer(self.chat_text(r), add_special_tokens=False)["input_ids"])
            for path in r.images:  # the template holds one placeholder per image; the processor expands it
                w, h = image_sizes.get(path, (448, 448))
                n += image_tokens(w, h, min_pixels=self.min_pixels, max_pixels=self.max_pixels,
                                  patch_size=self.patch_size, merge_size=self.merge_size) - 1
            if n >= limit:
                problems[r.id] = f"prompt is {n} tokens (text + images); the model's context is {limit}"
        return problems

    # -- running ----------------------------------------------------------------------------
    def run(self, requests: Sequence[Request], image_sizes: dict, batch_size: int, max_batch_tokens: int | None = None
            ) -> Iterator[tuple[list[int], list[SampleResult], BatchTiming | None]]:
        """Yield (input indices, results, timing) batch by batch, most expensive batch first.
        ``timing`` is None for a batch that produced only error rows.

        With ``overlap`` (default on CUDA) a worker thread prepares batch k+1 — images decoded and
        resized, and on a GPU the processor's tensors too — while batch k generates; the timing says how
        much preprocessing the model still waited for."""
        import torch

        if self.settings.seed is not None:
            torch.manual_seed(self.settings.seed)
        plan = self.plan(requests, image_sizes, batch_size, max_batch_tokens)
        if not self.overlap:
            for indices in plan:
                yield from self._run_resilient(requests, indices)
            return
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="vlmfast-prefetch") as pool:
            pending = pool.submit(self._timed_load, [requests[i] for i in plan[0]]) if plan else None
            for k, indices in enumerate(plan):
                waited = time.perf_counter()
                images, failed, load_s, inputs = pending.result()
                waited = time.perf_counter() - waited
                if k + 1 < len(plan):
                    pending = pool.submit(self._timed_load, [requests[i] for i in plan[k + 1]])
                yield from self._run_resilient(requests, indices, (images, failed, load_s, waited, inputs))

    def _timed_load(self, batch):
        """The prefetch worker's job: decode images and build the model inputs for ``batch``."""
        start = time.perf_counter()
        images, failed = self.load_images(batch)
        ok = [r for r in batch if r.id not in failed]
        # The processor runs torch ops: on a GPU the main thread only waits, so building tensors here
        # is free; on a CPU it fights decode for the same cores (measured: decode 2.6× slower).
        inputs = self.build_inputs(ok, images) if ok and self.on_cuda else None
        return images, failed, time.perf_counter() - start, inputs

    def _run_resilient(self, requests: Sequence[Request], indices: list[int], preloaded=None):
        """A CUDA out-of-memory error halves the batch and retries both halves; a sample that does not
        fit even alone becomes an error row. Nothing is dropped, and the count lands in the report."""
        try:
            results, timing = self.generate_batch([requests[i] for i in indices], preloaded)
        except Exception as exc:
            if not is_out_of_memory(exc):
                raise
            free_device_cache()
            if len(indices) == 1:
                r = requests[indices[0]]
                yield indices, [SampleResult(r.id, list(r.images), r.prompt, error=f"out of memory even alone ({exc})")], None
                return
            self.oom_splits += 1
            half = len(indices) // 2
            for part in (indices[:half], indices[half:]):
                yield from self._run_resilient(requests, part, _subset(preloaded, [requests[i].id for i in part]))
            return
        yield indices, results, timing

    def warm_up(self, requests: Sequence[Request]) -> tuple[float, bool]:
        """Compile before the clock starts: one untimed generate on the first batch's exact shapes
        (the static cache is sized prompt + max_new_tokens, so the full length is needed).
        Returns (seconds, whether generate really compiled the forward)."""
        start = time.perf_counter()
        images, failed = self.load_images(requests)
        ok = [r for r in requests if r.id not in failed]  # broken images become error rows later, not here
        for batch in (ok, ok[:1]):  # out of memory at full size: compile on one sample instead
            if not batch:
                break
            try:
                self.generate(self.build_inputs(batch, images))
                break
            except Exception as exc:
                if not is_out_of_memory(exc):
                    raise
                free_device_cache()
        compiled = getattr(self.loaded.model, "_compiled_call", None) is not None
        return time.perf_counter() - start, compiled

    def chat_text(self, request: Request) -> str:
        content = [{"type": "image", "image": p} for p in request.images] + [{"type": "text", "text": request.prompt}]
        system = [{"role": "system", "content": request.system}] if request.system else []
        return self.loaded.processor.apply_chat_template(
            system + [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True)

    def load_images(self, batch: Sequence[Request]) -> tuple[dict[str, list], dict[str, str]]:
        """Decode and resize every image (Qwen's rule, our pixel limits). A file that passed the
        header check but fails to decode (truncated data) fails only its own request."""
        from qwen_vl_utils import fetch_image

        images: dict[str, list] = {}
        failed: dict[str, str] = {}
        for r in batch:
            loaded = []
            for path in r.images:
                try:
                    loaded.append(fetch_image({"image": path, "min_pixels": self.min_pixels, "max_pixels": self.max_pixels},
                                              image_patch_size=self.patch_size))
                except Exception as exc:  # PIL raises many types for corrupt data
                    failed[r.id] = f"{path}: cannot decode image ({type(exc).__name__}: {exc})"
                    break
            else:
                images[r.id] = loaded
        return images, failed

    def build_inputs(self, batch: Sequence[Request], images: dict[str, list]):
        """Chat template + processor → padded tensors on the model's device."""
        flat = [im for r in batch for im in images[r.id]]
        # compiled graphs are specialised on shapes: bucket prompt lengths to cut recompiles
        bucket = {"pad_to_multiple_of": COMPILE_LENGTH_BUCKET} if self.compile else {}
        inputs = self.loaded.processor(
            text=[self.chat_text(r) for r in batch], images=flat or None, padding=True, return_tensors="pt",
            size={"shortest_edge": self.min_pixels, "longest_edge": self.max_pixels}, **bucket,
        ).to(self.loaded.model.device)
        if "pixel_values" in inputs:
            inputs["pixel_values"] = inputs["pixel_values"].to(self.loaded.model.dtype)
        return inputs

    def preprocess(self, batch: Sequence[Request]):
        """Model inputs for ``batch``; raises InputError if an image cannot be decoded."""
        images, failed = self.load_images(batch)
        if failed:
            raise InputError("; ".join(failed.values()), hint="remove or replace the broken images")
        return self.build_inputs(batch, images)

    def generate_batch(self, batch: Sequence[Request], preloaded=None) -> tuple[list[SampleResult], BatchTiming | None]:
        """Results for ``batch`` in its order; requests whose images fail to decode get error rows.
        ``preloaded``: (images, failed, load_s, waited_s, inputs or None) from the prefetch worker."""
        device = self.loaded.model.device
        t0 = now(device)
        inputs = None
        if preloaded is None:
            images, failed = self.load_images(batch)
            worker_s = waited_s = 0.0
        else:  # the worker's time, and how long this thread waited for it (the exposed part)
            images, failed, worker_s, waited_s, inputs = preloaded
        done = {r.id: SampleResult(r.id, list(r.images), r.prompt, error=failed[r.id]) for r in batch if r.id in failed}
        ok = [r for r in batch if r.id not in failed]
        if not ok:
            return [done[r.id] for r in batch], None
        if inputs is None:
            inputs = self.build_inputs(ok, images)
        clock = _StepClock(device, self.record_steps)
        t1 = now(device)
        output = self.generate(inputs, clock)
        t2 = now(device)

        prompt_len = inputs["input_ids"].shape[1]
        new = output[:, prompt_len:].tolist()
        done.update({r.id: self._result(r, inputs, row, new[row]) for row, r in enumerate(ok)})
        first = clock.times[0] if clock.times else t2
        # decode-step latencies: between consecutive tokens (the first token's wait is the TTFT)
        step_times = tuple(b - a for a, b in zip(clock.times, clock.times[1:])) if self.record_steps else ()
        timing = BatchTiming(
            # waiting can outlast the worker's own time (it started late): count the longer of the two
            size=len(ok), preprocess_s=t1 - t0 + max(worker_s, waited_s), ttft_s=first - t1, decode_s=t2 - first, steps=len(new[0]),
            new_tokens=sum(done[r.id].n_new_tokens for r in ok), step_times_s=step_times,
            preprocess_exposed_s=t1 - t0 + waited_s,
        )
        return [done[r.id] for r in batch], timing

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
        if self.compile:
            kwargs.update(cache_implementation="static", compile_config=compile_config(loaded.runtime.device))
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


def _subset(preloaded, ids: list[str]):
    """The prefetched images of some of a batch's requests (after an out-of-memory split)."""
    if preloaded is None:
        return None
    images, failed = preloaded[0], preloaded[1]
    # the batch's prebuilt tensors do not fit a half: rebuilt from the decoded images
    return ({i: images[i] for i in ids if i in images}, {i: failed[i] for i in ids if i in failed}, 0.0, 0.0, None)


def compile_config(device: str):
    """torch.compile settings for generate's static-cache decode step. transformers compiles on CUDA by
    itself; elsewhere it must be told (``_compile_all_devices``, the switch its own tests use)."""
    from transformers import CompileConfig

    config = CompileConfig(fullgraph=False, dynamic=False)
    if not device.startswith("cuda"):
        config._compile_all_devices = True
    return config


def is_out_of_memory(exc: BaseException) -> bool:
    import torch

    return isinstance(exc, torch.cuda.OutOfMemoryError)


def free_device_cache() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def processor_pixel_limits(image_processor) -> tuple[int, int]:
    """(min_pixels, max_pixels) of a Qwen2-VL image processor, across transformers versions."""
    size = getattr(image_processor, "size", None) or {}
    get = size.get if isinstance(size, dict) else lambda k, d=None: getattr(size, k, d)
    lo = get("shortest_edge") or getattr(image_processor, "min_pixels", None) or 56 * 56
    hi = get("longest_edge") or getattr(image_processor, "max_pixels", None) or 16384 * 28 * 28
    return int(lo), int(hi)

