"""``infer`` as a library call: inputs → (resume) → load → batches → engine → results → report.

The CLI builds :class:`InferOptions` and renders the :class:`InferReport`; Python users call
:func:`infer` directly and get the same numbers and rows.
"""

from __future__ import annotations

import platform
import time
from pathlib import Path
import dataclasses
from dataclasses import asdict, dataclass, field
from typing import Protocol

from . import __version__
from .engine import BatchTiming, Engine, GenerationSettings, SampleResult
from .errors import UsageError
from .inputs import DEFAULT_MAX_IMAGE_PIXELS, BadInput, Collected, Problem, collect, raise_for_problems
from .parallel import Distributed
from .results import ResultsWriter, finalize, part_path, prepare_out, read_existing
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
    retry_errors: bool = False  # resume: redo ids whose earlier row is an error row
    skip_bad: bool = False
    batch_size: int | None = None  # None: auto (from free GPU memory; CPU_BATCH_SIZE on a CPU)
    generation: GenerationSettings = field(default_factory=GenerationSettings)
    min_pixels: int | None = None
    max_pixels: int | None = None
    device: str | None = None
    dtype: str | None = None
    attn: str | None = None
    trust_remote_code: bool = False
    allow_pickle: bool = False
    base: str | None = None  # LoRA adapter checkpoints: the base model (default: adapter_config.json's)
    merge: bool = False  # LoRA: merge the adapter into the weights before generating
    max_batch_tokens: int | None = None
    max_image_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS
    overlap: bool | None = None  # prepare the next batch while this one generates (None: on CUDA only)
    compile: bool = False  # static KV cache + torch.compile of the decode step


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
    compile_s: float | None  # --compile: compilation + warm-up, before the clock of generate_s
    preprocess_s: float  # all preprocessing work
    preprocess_exposed_s: float  # the part generation waited for (the rest overlapped decoding)
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
    oom_splits: int  # batches halved after a CUDA out-of-memory error
    max_pixels: int | None
    max_pixels_capped: bool
    decode_gb_per_s: float | None  # LM weights + KV cache read per decode step ÷ step time
    peak_gb_per_s: float | None  # the device's datasheet peak (CUDA devices vlmfast knows)
    bandwidth_pct_of_peak: float | None
    notes: list[str]
    versions: dict
    out: str | None
    processes: list[dict] = field(default_factory=list)  # per-process figures of a multi-process run
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
    anything the user can fix; nothing is written when inputs are bad (unless ``skip_bad``).

    Launched with several processes (``accelerate launch``), each process runs its share and the
    main process returns the combined report (the others return their own)."""
    from .checkpoint import load

    dist = Distributed()
    collected = collect(
        images=options.images, prompt=options.prompt, prompt_file=options.prompt_file, manifest=options.manifest,
        template=options.template, system=options.system, max_image_pixels=options.max_image_pixels,
    )
    if not options.skip_bad:
        raise_for_problems(collected)
    if dist.world > 1 and options.out is None:
        raise UsageError(f"{dist.world} processes need a results file", hint="add --out results.jsonl")
    notes = list(collected.warnings)
    out = Path(options.out) if options.out is not None else None
    if out is not None and not options.overwrite:
        read_existing(out, repair=False)  # a file that is not ours fails every process alike, not just the main one
    if out is not None and dist.is_main:
        notes += prepare_out(out, overwrite=options.overwrite)
    dist.barrier()  # every process reads the same, repaired file
    done, _ = read_existing(out, repair=False) if out is not None else ({}, None)
    if options.retry_errors:  # error rows are redone; the new row replaces the old one when the file is finalized
        done = {rid: row for rid, row in done.items() if row.get("error") is None}
    order = [r.id for r in collected.requests] + [b.id for b in collected.bad]
    todo = [r for r in collected.requests if r.id not in done]
    bad = [b for b in collected.bad if b.id not in done]
    skipped = len(order) - len(todo) - len(bad)
    if skipped:
        notes.append(f"resuming: {skipped} id(s) already in {options.out} were skipped (--overwrite redoes them)")

    device = options.device
    if dist.world > 1 and device not in (None, "cpu", "auto"):  # one device per process, not all on one
        notes.append(f"--device {device} ignored: each of the {dist.world} processes uses its own ({dist.device})")
        device = None
    if loaded is None:
        loaded = load(options.ckpt, device=device or dist.device, dtype=options.dtype, attn=options.attn,
                      trust_remote_code=options.trust_remote_code, allow_pickle=options.allow_pickle,
                      base=options.base, merge=options.merge)
    notes.extend(loaded.notes)
    engine = Engine(loaded, options.generation, min_pixels=options.min_pixels, max_pixels=options.max_pixels,
                    overlap=options.overlap, compile=options.compile)
    if engine.max_pixels_capped:
        notes.append(f"max_pixels capped at {engine.max_pixels} (the checkpoint's processor allows more; raise it with --max-pixels)")
    too_long = engine.context_problems(todo, collected.image_sizes)  # same verdict on every process
    if too_long:
        long_bad = [BadInput(r.id, (Problem(r.id, too_long[r.id]),), r) for r in todo if r.id in too_long]
        if not options.skip_bad:
            raise_for_problems(Collected(requests=[], bad=long_bad))
        todo = [r for r in todo if r.id not in too_long]
        bad += long_bad

    batch_size, batch_note = choose_batch_size(options.batch_size, loaded, engine, todo, collected.image_sizes)
    options = dataclasses.replace(options, batch_size=batch_size)
    notes += [batch_note] if batch_note else []
    my_todo, my_bad = dist.split(todo), dist.split(bad)
    compile_s = None
    if options.compile and my_todo:
        first = engine.plan(my_todo, collected.image_sizes, batch_size, options.max_batch_tokens)[0]
        compile_s, compiled = engine.warm_up([my_todo[i] for i in first])
        notes.append(f"compile + warm-up: {compile_s:.1f} s, not counted in generate_s" if compiled else
                     "--compile: this transformers/model combination did not compile; ran eager with a static cache")
    writer = ResultsWriter(part_path(out, dist.rank) if dist.world > 1 else out)
    device = loaded.runtime.device
    reset_peak_memory(device)
    position = {rid: i for i, rid in enumerate(order)}
    results: list[SampleResult] = []
    timings: list[BatchTiming] = []
    if progress:
        progress.start(len(my_todo) + len(my_bad))
    start = time.perf_counter()
    try:
        if my_bad:
            rows = [SampleResult(id=b.id, images=list(b.request.images) if b.request else [],
                                 prompt=b.request.prompt if b.request else "", error=b.error) for b in my_bad]
            writer.write([r.record() for r in rows], [position[r.id] for r in rows])
            results.extend(rows)
            if progress:
                progress.advance(len(rows), 0)
        for _, batch_results, timing in engine.run(my_todo, collected.image_sizes, options.batch_size,
                                                   options.max_batch_tokens):
            writer.write([r.record() for r in batch_results], [position[r.id] for r in batch_results])
            results.extend(batch_results)
            if timing is not None:
                timings.append(timing)
            if progress:
                progress.advance(len(batch_results), timing.new_tokens if timing else 0)
    finally:
        writer.close()
    generate_s = time.perf_counter() - start
    mine = {"rank": dist.rank, "device": device, "results": results, "timings": timings, "generate_s": generate_s,
            "peak": peak_memory_mib(device), "oom_splits": engine.oom_splits}
    dist.barrier()
    everyone = dist.gather(mine) if dist.world > 1 else [mine]
    if dist.is_main and out is not None:
        finalize(out, order)
    if not dist.is_main:
        everyone = [mine]
    combined = sorted((r for p in everyone for r in p["results"]), key=lambda r: position[r.id])
    report = summarize(
        options, loaded, engine, combined, [t for p in everyone for t in p["timings"]],
        generate_s=max(p["generate_s"] for p in everyone), skipped=skipped, notes=notes,
        peak=max((p["peak"] for p in everyone), key=lambda x: x[0]),
        oom_splits=sum(p["oom_splits"] for p in everyone), compile_s=compile_s,
    )
    if dist.world > 1:
        report.processes = [_process_figures(p) for p in everyone]
    return report


CPU_BATCH_SIZE = 8  # measured on 2 cores: batch 8 is 4× the per-sample loop (benchmarks/RESULTS.md)


def choose_batch_size(requested, loaded, engine, requests, image_sizes) -> tuple[int, str | None]:
    """``requested`` when given; otherwise the largest batch whose KV cache and activations fit the
    GPU memory left after loading (CPU: a measured default)."""
    if requested:
        return requested, None
    device = loaded.runtime.device
    if not device.startswith("cuda"):
        return CPU_BATCH_SIZE, f"batch size auto: {CPU_BATCH_SIZE} on a CPU"
    import torch

    from .capacity import auto_batch_size, shape_from_model

    free, _ = torch.cuda.mem_get_info(torch.device(device))
    widest = max((engine.cost(r, image_sizes) for r in requests), default=0)
    context = widest + engine.settings.max_new_tokens
    shape = shape_from_model(loaded.model, loaded.runtime.dtype)
    # vision tower activations for the widest sample: ~4 patches per image token, a dozen live tensors
    vision_hidden = getattr(loaded.model.config.vision_config, "hidden_size", 1280)
    vision = widest * 4 * vision_hidden * shape.dtype_bytes * 12
    size = auto_batch_size(shape, free, context, vision_bytes_per_sample=vision)
    return size, (f"batch size auto: {size} (free GPU memory {free / 2**30:.1f} GiB, contexts up to {context} tokens, "
                  f"{shape.kv_bytes_per_token / 1024:.0f} KiB of KV cache per token)")


def _process_figures(p: dict) -> dict:
    tokens = sum(r.n_new_tokens for r in p["results"] if r.error is None)
    return {"rank": p["rank"], "device": p["device"], "samples": len(p["results"]), "new_tokens": tokens,
            "generate_s": round(p["generate_s"], 4),
            "tokens_per_s": round(tokens / p["generate_s"], 2) if p["generate_s"] > 0 else 0.0}


def summarize(options, loaded, engine, results, timings, *, generate_s, skipped, notes, peak, oom_splits=0,
              compile_s=None) -> InferReport:
    ok = [r for r in results if r.error is None]
    if oom_splits:
        notes = notes + [f"out of memory: {oom_splits} batch(es) were halved and retried"]
    new_tokens = sum(r.n_new_tokens for r in ok)
    ttft_ms = [t.ttft_s * 1000 for t in timings for _ in range(t.size)]  # each sample waits for its batch
    decode_steps = sum(max(t.steps - 1, 0) for t in timings)
    decode_s = sum(t.decode_s for t in timings)
    decode_ms_per_token = decode_s * 1000 / decode_steps if decode_steps else None
    return InferReport(
        checkpoint=loaded.source,
        samples=len(results),
        errors=len(results) - len(ok),
        skipped_existing=skipped,
        new_tokens=new_tokens,
        load_s=round(loaded.load_s, 4),
        compile_s=None if compile_s is None else round(compile_s, 3),
        preprocess_s=round(sum(t.preprocess_s for t in timings), 4),
        preprocess_exposed_s=round(sum(t.preprocess_exposed_s or 0.0 for t in timings), 4),
        generate_s=round(generate_s, 4),
        ttft_ms_p50=_round(percentile(ttft_ms, 50)),
        ttft_ms_p90=_round(percentile(ttft_ms, 90)),
        decode_ms_per_token=_round(decode_ms_per_token),
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
        oom_splits=oom_splits,
        max_pixels=engine.max_pixels,
        max_pixels_capped=engine.max_pixels_capped,
        **_bandwidth(loaded, ok, timings, decode_ms_per_token),
        notes=notes,
        versions=versions(),
        out=options.out,
        results=results,
        batch_timings=timings,
    )


def _bandwidth(loaded, ok, timings, decode_ms_per_token) -> dict:
    """Achieved decode bandwidth at the run's mean batch and mid-decode context (:mod:`vlmfast.capacity`)."""
    from .capacity import run_bandwidth

    if not ok or not timings:
        return run_bandwidth(loaded, 1, 0, None)
    batch = sum(t.size for t in timings) / len(timings)
    context = sum(r.n_prompt_tokens + r.n_new_tokens / 2 for r in ok) / len(ok)
    return run_bandwidth(loaded, batch, context, decode_ms_per_token)


def _round(value, digits=3):
    return None if value is None else round(value, digits)
