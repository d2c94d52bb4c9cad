"""``infer`` as a library call: inputs → (resume) → load → batches → engine → results → report.

The CLI builds :class:`InferOptions` and renders the :class:`InferReport`; Python users call
:func:`infer` directly and get the same numbers and rows.
"""

from __future__ import annotations

import platform
import time
from dataclasses import asdict, dataclass, field
from typing import Protocol

from . import __version__
from .engine import BatchTiming, Engine, GenerationSettings, SampleResult
from .inputs import collect, raise_for_problems
from .results import ResultsWriter
from .timing import peak_memory_mib, percentile, reset_peak_memory


@dataclass
class InferOptions:
    ckpt: str
    images: list[str] | None = None
    prompt: str | None = None
    prompt_file: str | None = None
    manifest: str | None = None
    template: str = "plain"
    system: str | None = None
    out: str | None = None
    overwrite: bool = False
    skip_bad: bool = False
    batch_size: int = 8
    generation: GenerationSettings = field(default_factory=GenerationSettings)
    min_pixels: int | None = None
    max_pixels: int | None = None
    device: str | None = None
    dtype: str | None = None
    attn: str | None = None
    trust_remote_code: bool = False
    record_steps: bool = False


class Progress(Protocol):
    def start(self, total_samples: int) -> None: ...
    def advance(self, samples: int, new_tokens: int) -> None: ...


@dataclass
class InferReport:
    """Everything ``--json`` prints. Times in seconds (``_s``) or milliseconds (``_ms``)."""

    checkpoint: str
    samples: int  # rows produced by this run (errors included)
    errors: int
    skipped_existing: int  # ids already in --out from an earlier run
    new_tokens: int
    load_s: float
    preprocess_s: float
    generate_s: float  # wall time after loading: preprocess + prefill + decode + writing
    ttft_ms_p50: float | None
    ttft_ms_p90: float | None
    decode_ms_per_token: float | None  # per decode step = per token of one sequence
    tokens_per_s: float
    samples_per_s: float
    peak_mem_mib: float
    peak_mem_kind: str
    cache: dict
    device: str
    dtype: str
    attn: str
    batch_size: int
    batches: int
    max_new_tokens: int
    finish: dict
    no_answer: int  # successful rows without an <answer>…</answer>
    max_pixels: int | None
    max_pixels_capped: bool
    notes: list[str]
    versions: dict
    out: str | None
    results: list[SampleResult] = field(default_factory=list, repr=False)
    batch_timings: list[BatchTiming] = field(default_factory=list, repr=False)

    def as_dict(self) -> dict:
        data = asdict(self)
        data.pop("results")
        data.pop("batch_timings")
        return data


def versions() -> dict:
    import torch
    import transformers

    return {"vlmfast": __version__, "torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version()}


def infer(options: InferOptions, progress: Progress | None = None, loaded=None) -> InferReport:
    """Run the whole ``infer`` flow. Raises :class:`~vlmfast.errors.VlmfastError` subclasses for
    anything the user can fix; nothing is written when inputs are bad (unless ``skip_bad``)."""
    from .checkpoint import load

    collected = collect(
        images=options.images, prompt=options.prompt, prompt_file=options.prompt_file, manifest=options.manifest,
        template=options.template, system=options.system,
    )
    if not options.skip_bad:
        raise_for_problems(collected)
    notes = list(collected.warnings)
    writer = ResultsWriter(options.out, overwrite=options.overwrite)
    notes.extend(writer.notes)
    order = [r.id for r in collected.requests] + [b.id for b in collected.bad]
    todo = [r for r in collected.requests if r.id not in writer.done]
    bad = [b for b in collected.bad if b.id not in writer.done]
    skipped = len(collected.requests) + len(collected.bad) - len(todo) - len(bad)
    if skipped:
        notes.append(f"resuming: {skipped} id(s) already in {options.out} were skipped (--overwrite redoes them)")

    if loaded is None:
        loaded = load(options.ckpt, device=options.device, dtype=options.dtype, attn=options.attn,
                      trust_remote_code=options.trust_remote_code)
    notes.extend(loaded.notes)
    engine = Engine(loaded, options.generation, min_pixels=options.min_pixels, max_pixels=options.max_pixels,
                    record_steps=options.record_steps)
    if engine.max_pixels_capped:
        notes.append(f"max_pixels capped at {engine.max_pixels} (the checkpoint's processor allows more; raise it with --max-pixels)")
    device = loaded.runtime.device
    reset_peak_memory(device)
    position = {rid: i for i, rid in enumerate(order)}
    results: list[SampleResult] = []
    timings: list[BatchTiming] = []
    if progress:
        progress.start(len(todo) + len(bad))
    start = time.perf_counter()
    try:
        if bad:
            rows = [SampleResult(id=b.id, images=list(b.request.images) if b.request else [],
                                 prompt=b.request.prompt if b.request else "", error=b.error) for b in bad]
            writer.write([r.record() for r in rows], [position[r.id] for r in rows])
            results.extend(rows)
            if progress:
                progress.advance(len(rows), 0)
        for _, batch_results, timing in engine.run(todo, collected.image_sizes, options.batch_size):
            writer.write([r.record() for r in batch_results], [position[r.id] for r in batch_results])
            results.extend(batch_results)
            timings.append(timing)
            if progress:
                progress.advance(len(batch_results), timing.new_tokens)
    finally:
        writer.close()
    generate_s = time.perf_counter() - start
    writer.finalize(order)
    results.sort(key=lambda r: position[r.id])  # batches ran by cost; callers get input order
    peak, peak_kind = peak_memory_mib(device)
    return summarize(
        options, loaded, engine, results, timings, generate_s=generate_s, skipped=skipped, notes=notes,
        peak=(peak, peak_kind),
    )


def summarize(options, loaded, engine, results, timings, *, generate_s, skipped, notes, peak) -> InferReport:
    ok = [r for r in results if r.error is None]
    new_tokens = sum(r.n_new_tokens for r in ok)
    ttft_ms = [t.ttft_s * 1000 for t in timings for _ in range(t.size)]  # each sample waits for its batch
    decode_steps = sum(max(t.steps - 1, 0) for t in timings)
    decode_s = sum(t.decode_s for t in timings)
    return InferReport(
        checkpoint=loaded.source,
        samples=len(results),
        errors=len(results) - len(ok),
        skipped_existing=skipped,
        new_tokens=new_tokens,
        load_s=round(loaded.load_s, 4),
        preprocess_s=round(sum(t.preprocess_s for t in timings), 4),
        generate_s=round(generate_s, 4),
        ttft_ms_p50=_round(percentile(ttft_ms, 50)),
        ttft_ms_p90=_round(percentile(ttft_ms, 90)),
        decode_ms_per_token=_round(decode_s * 1000 / decode_steps) if decode_steps else None,
        tokens_per_s=round(new_tokens / generate_s, 2) if generate_s > 0 else 0.0,
        samples_per_s=round(len(ok) / generate_s, 3) if generate_s > 0 else 0.0,
        peak_mem_mib=round(peak[0], 1),
        peak_mem_kind=peak[1],
        cache=loaded.cache.as_dict(),
        device=loaded.runtime.device,
        dtype=loaded.runtime.dtype,
        attn=loaded.runtime.attn,
        batch_size=options.batch_size,
        batches=len(timings),
        max_new_tokens=options.generation.max_new_tokens,
        finish={"eos": sum(r.finish_reason == "eos" for r in ok), "length": sum(r.finish_reason == "length" for r in ok)},
        no_answer=sum(r.answer is None for r in ok),
        max_pixels=engine.max_pixels,
        max_pixels_capped=engine.max_pixels_capped,
        notes=notes,
        versions=versions(),
        out=options.out,
        results=results,
        batch_timings=timings,
    )


def _round(value, digits=3):
    return None if value is None else round(value, digits)
