"""``infer`` as a library call, step by step:

locate the checkpoint → collect inputs (and what an earlier run already wrote) → load → drop prompts
longer than the context → choose the batch size → run the batches (each written, fsync'd and scored as
it finishes) → gather the processes' rows → report.

The CLI builds :class:`InferOptions` and renders the :class:`InferReport`; Python users call
:func:`infer` directly and get the same numbers and rows.
"""

from __future__ import annotations

import dataclasses
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from .engine import BatchTiming, Engine, GenerationSettings, SampleResult
from .errors import EXIT_FAILURE, UsageError, VlmfastError
from .inputs import DEFAULT_MAX_IMAGE_PIXELS, BadInput, Collected, Problem, Request, collect, raise_for_problems
from .parallel import Distributed
from .results import ResultsWriter, finalize, part_path, prepare_out, read_existing
from .summary import InferReport, final_rows, process_figures, summarize
from .timing import peak_memory_mib, reset_peak_memory, versions


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
    decoder: str = "vlmfast"  # "vlmfast" (own decode loop) | "hf" (plain model.generate, the reference)
    cuda_graphs: bool | None = None  # None: on CUDA with the vlmfast decoder
    compile: bool | None = None  # None: decided after the first batch, by what the workload would save
    scorer: str = "auto"  # default scorer for rows with ground truth and no scorer of their own
    iou: float = 0.5
    bbox_space: str = "resized"
    engine: str = "hf"  # "hf" (vlmfast's engine on transformers) | "vllm"
    tensor_parallel_size: int = 1  # --engine vllm only, like the three below
    data_parallel_size: int = 1
    gpu_memory_utilization: float = 0.9
    max_num_seqs: int | None = None


class Progress(Protocol):
    def start(self, total_samples: int) -> None: ...
    def advance(self, samples: int, new_tokens: int) -> None: ...


@dataclass
class Work:
    """What this run has to do: requests to generate, bad inputs to record (``--skip-bad``), every id
    in input order, and what an earlier run already finished."""

    todo: list[Request]
    bad: list[BadInput]
    order: list[str]
    image_sizes: dict
    skipped: int
    notes: list[str]


class RunFailed(VlmfastError):
    """A process of a parallel run failed; every process stops at the same batch boundary."""

    exit_code = EXIT_FAILURE


def infer(options: InferOptions, progress: Progress | None = None, loaded=None) -> InferReport:
    """Run the whole ``infer`` flow. Raises :class:`~vlmfast.errors.VlmfastError` subclasses for
    anything the user can fix; nothing is written when inputs are bad (unless ``skip_bad``).

    Launched with several processes (``accelerate launch``), each process runs its share and the
    main process returns the combined report (the others return their own)."""
    from .locate import locate

    found = locate(options.ckpt, hub=True) if loaded is None else None  # a wrong path fails in well under a second
    dist = Distributed()
    check_engine_options(options, dist)
    work = collect_work(options, dist)
    if options.engine == "vllm":
        engine, facts = open_vllm(options, found)
    else:
        engine, facts = open_hf(options, found, loaded, dist, work)
    try:
        if engine.max_pixels_capped:
            work.notes.append(f"max_pixels capped at {engine.max_pixels} (the checkpoint's processor allows more; raise it with --max-pixels)")
        drop_too_long(engine, work, options.skip_bad)  # same verdict on every process
        if options.engine == "vllm":
            batch_size, note = options.batch_size or VLLM_CHUNK[engine.device], None
            facts["load_s"] += engine.start(work.todo)  # vLLM's start-up is loading, not generating
        else:
            batch_size, note = choose_batch_size(options.batch_size, facts["loaded"], engine, work.todo, work.image_sizes)
        options = dataclasses.replace(options, batch_size=batch_size)
        work.notes += [note] if note else []
        mine = run_batches(engine, options, work, dist, progress)
    finally:
        if options.engine == "vllm":
            engine.close()
    dist.barrier()
    everyone = dist.gather(mine) if dist.world > 1 else [mine]
    out = Path(options.out) if options.out else None
    if dist.is_main and out is not None:
        finalize(out, work.order)
    if not dist.is_main:
        everyone = [mine]
    position = {rid: i for i, rid in enumerate(work.order)}
    combined = sorted((r for p in everyone for r in p["results"]), key=lambda r: position[r.id])
    report = summarize(
        options, facts, engine, combined, [t for p in everyone for t in p["timings"]],
        generate_s=max(p["generate_s"] for p in everyone), skipped=work.skipped, notes=work.notes + mine["notes"],
        peak=max((p["peak"] for p in everyone), key=lambda x: x[0]),
        oom_splits=sum(p["oom_splits"] for p in everyone), compile_s=max(p["compile_s"] for p in everyone),
        scored_rows=final_rows(out) if out is not None and dist.is_main else [r.record() for r in combined],
    )
    if dist.world > 1:
        report.processes = [process_figures(p) for p in everyone]
    return report


VLLM_CHUNK = {"cpu": 8, "cuda": 512}  # requests per LLM.generate call: vLLM batches inside; a chunk is what a kill can lose
HF_ONLY = (("device", None, "--device"), ("attn", None, "--attn"), ("decoder", "vlmfast", "--decoder"),
           ("cuda_graphs", None, "--cuda-graphs"), ("compile", None, "--compile"), ("overlap", None, "--overlap"),
           ("max_batch_tokens", None, "--max-batch-tokens"), ("allow_pickle", False, "--allow-pickle"))


def check_engine_options(options: InferOptions, dist: Distributed) -> None:
    """Options that belong to the other engine are errors, not silently ignored."""
    if options.engine == "vllm":
        given = [flag for name, default, flag in HF_ONLY if getattr(options, name) not in (default, "auto")]
        if given:
            raise UsageError(f"{', '.join(given)} apply to the HF engine, not to --engine vllm",
                             hint="drop them; vLLM picks its own device, attention and CUDA graphs")
        if dist.world > 1:
            raise UsageError("--engine vllm runs its own processes: launch vlmfast once, without accelerate",
                             hint="use --data-parallel-size N and/or --tensor-parallel-size N")
    elif (options.tensor_parallel_size, options.data_parallel_size, options.max_num_seqs) != (1, 1, None):
        raise UsageError("--tensor-parallel-size, --data-parallel-size and --max-num-seqs apply to --engine vllm",
                         hint="add --engine vllm, or launch several processes with accelerate for the HF engine")


def open_hf(options: InferOptions, found, loaded, dist: Distributed, work) -> tuple[Engine, dict]:
    """The HF engine on a loaded model (the compile cache pointed at before the model loads)."""
    from .checkpoint import load

    compile_cache = _compile_cache(options)
    device = options.device
    if dist.world > 1 and device not in (None, "cpu", "auto"):  # one device per process, not all on one
        work.notes.append(f"--device {device} ignored: each of the {dist.world} processes uses its own ({dist.device})")
        device = None
    if loaded is None:
        loaded = load(found, device=device or dist.device, dtype=options.dtype, attn=options.attn,
                      trust_remote_code=options.trust_remote_code, allow_pickle=options.allow_pickle,
                      base=options.base, merge=options.merge)
    work.notes.extend(loaded.notes)
    work.notes += [compile_cache.note] if compile_cache is not None and compile_cache.note else []
    engine = build_engine(options, loaded, compile_cache)
    facts = {"loaded": loaded, "checkpoint": loaded.source, "load_s": loaded.load_s, "cache": loaded.cache.as_dict(),
             "device": loaded.runtime.device, "dtype": loaded.runtime.dtype, "attn": loaded.runtime.attn, "engine": None}
    return engine, facts


def open_vllm(options: InferOptions, found):
    """The vLLM engine (checkpoint overlay, processor, sampling settings; vLLM itself starts later)."""
    from .ckpt_files import cache_off_locations, read_configs, saved_cache_enabled
    from .vllm_engine import VllmEngine

    started = time.perf_counter()
    engine = VllmEngine(found.source if found is not None else options.ckpt, options.generation, base=options.base,
                        min_pixels=options.min_pixels, max_pixels=options.max_pixels,
                        dtype=None if options.dtype in (None, "auto") else options.dtype,
                        tensor_parallel_size=options.tensor_parallel_size, data_parallel_size=options.data_parallel_size,
                        gpu_memory_utilization=options.gpu_memory_utilization, max_num_seqs=options.max_num_seqs,
                        trust_remote_code=options.trust_remote_code)
    described = engine.describe()
    saved = found.path if found is not None and found.kind == "model" else None  # the checkpoint's own configs, not the overlay's
    config, generation = read_configs(saved) if saved is not None else ({}, None)
    facts = {"loaded": None, "checkpoint": engine.ckpt, "load_s": time.perf_counter() - started,
             "cache": {"found_off": cache_off_locations(config, generation),  # vLLM always caches; said for the record
                       "saved_enabled": saved_cache_enabled(config, generation), "forced_on": True},
             "device": engine.device, "dtype": described["dtype"], "attn": "vllm", "engine": described}
    return engine, facts


def collect_work(options: InferOptions, dist: Distributed) -> Work:
    """Inputs checked (all problems at once, before any model loads) and, with ``--out``, the ids an
    earlier run already finished: those are skipped (error rows redone with ``retry_errors``)."""
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
    todo = [r for r in collected.requests if r.id not in done]
    bad = [b for b in collected.bad if b.id not in done]
    skipped = len(collected.order) - len(todo) - len(bad)
    if skipped:
        notes.append(f"resuming: {skipped} id(s) already in {options.out} were skipped (--overwrite redoes them)")
    return Work(todo, bad, collected.order, collected.image_sizes, skipped, notes)


def build_engine(options: InferOptions, loaded, compile_cache=None) -> Engine:
    return Engine(loaded, options.generation, min_pixels=options.min_pixels, max_pixels=options.max_pixels,
                  decoder=options.decoder, cuda_graphs=options.cuda_graphs, compile=bool(options.compile),
                  compile_cache=compile_cache, prefill_tokens=options.max_batch_tokens)


def _compile_cache(options: InferOptions):
    """The persistent compile cache, pointed at before the model loads (see CompileCache.activate);
    None when nothing can compile (``--decoder hf``, ``--no-compile``)."""
    if options.decoder != "vlmfast" or options.compile is False:
        return None
    from .compile_cache import CompileCache

    cache = CompileCache(versions())
    cache.activate()
    return cache


def drop_too_long(engine: Engine, work: Work, skip_bad: bool) -> None:
    """Prompts (text + image tokens) that leave no room in the model's context: an error before
    anything runs, or error rows with ``skip_bad``."""
    too_long = engine.context_problems(work.todo, work.image_sizes)
    if not too_long:
        return
    long_bad = [BadInput(r.id, (Problem(r.id, too_long[r.id]),), r) for r in work.todo if r.id in too_long]
    if not skip_bad:
        raise_for_problems(Collected(requests=[], bad=long_bad))
    work.todo = [r for r in work.todo if r.id not in too_long]
    work.bad += long_bad


def run_batches(engine: Engine, options: InferOptions, work: Work, dist: Distributed, progress) -> dict:
    """This process's share: error rows first, then every batch — written (fsync'd) and scored as it
    finishes. Each batch boundary is a collective check, so a failure on any process ends the run on
    every process at once, with the rows written so far kept for a resume."""
    from .scheduler import Scheduler, plan

    my_todo, my_bad = dist.split(work.todo), dist.split(work.bad)
    if options.engine == "vllm":  # vLLM schedules inside a chunk; chunks in input order are the resume granularity
        scheduler, batches = engine, engine.plan(my_todo, work.image_sizes, options.batch_size)
    else:
        scheduler = Scheduler(engine, overlap=options.overlap)
        batches = plan(engine, my_todo, work.image_sizes, options.batch_size,
                       options.max_batch_tokens if options.decoder == "hf" else None)
    rounds = dist.reduce_max(len(batches))  # every process takes part in every boundary check
    out = Path(options.out) if options.out is not None else None
    writer = ResultsWriter(part_path(out, dist.rank) if dist.world > 1 else out)
    position = {rid: i for i, rid in enumerate(work.order)}
    truths = {r.id: (r.truth, r.scorer) for r in my_todo}
    results: list[SampleResult] = []
    timings: list[BatchTiming] = []
    notes: list[str] = []

    def emit(rows: list[SampleResult], new_tokens: int) -> None:
        score_rows(rows, truths, options)
        writer.write([r.record() for r in rows], [position[r.id] for r in rows])
        results.extend(rows)
        if progress:
            progress.advance(len(rows), new_tokens)

    reset_peak_memory(engine.device)
    if progress:
        progress.start(len(my_todo) + len(my_bad))
    start = time.perf_counter()
    failure = None
    try:
        if my_bad:
            emit([SampleResult(id=b.id, images=list(b.request.images) if b.request else [],
                               prompt=b.request.prompt if b.request else "", error=b.error) for b in my_bad], 0)
        stream = scheduler.batches(my_todo, work.image_sizes, batches)
        for k in range(rounds):
            if failure is None and k < len(batches):
                try:
                    for _, rows, timing in next(stream):
                        emit(rows, timing.new_tokens if timing else 0)
                        timings += [timing] if timing else []
                    if k == 0 and options.compile is None and options.engine == "hf":
                        notes += decide_compile(engine, timings, len(batches) - 1)
                except Exception as exc:  # noqa: BLE001 - reported collectively below
                    failure = exc
            if dist.any(failure is not None):
                break
    finally:
        writer.close()
        if getattr(engine, "compile_cache", None) is not None:
            engine.compile_cache.flush()  # what a step cost here, compiled or not: the next run's decision
    if dist.world > 1 and dist.any(failure is not None):
        _fail_together(dist, failure, out)
    elif failure is not None:
        raise failure
    return {"rank": dist.rank, "device": engine.device, "results": results, "timings": timings,
            "generate_s": time.perf_counter() - start - engine.compile_s, "peak": peak_memory_mib(engine.device),
            "oom_splits": scheduler.oom_splits, "compile_s": engine.compile_s,
            "notes": notes + list(getattr(engine, "notes", [])) if options.engine == "hf" else notes}


def _fail_together(dist: Distributed, failure: BaseException | None, out: Path | None):
    """Every process raises the same RunFailed naming the process that failed and why; the failing
    process also prints its traceback (its own stderr, once)."""
    if failure is not None and not isinstance(failure, VlmfastError):
        traceback.print_exception(failure)
    said = f"{type(failure).__name__}: {getattr(failure, 'message', failure)}" if failure is not None else None
    reasons = [(rank, text) for rank, text in enumerate(dist.gather(said)) if text is not None]
    listing = "; ".join(f"process {rank}: {text}" for rank, text in reasons)
    raise RunFailed(f"{len(reasons)} of {dist.world} processes failed ({listing}); every process stopped",
                    hint=f"finished batches are kept{f' beside {out}' if out else ''}; rerun the same command to resume")


def decide_compile(engine: Engine, timings: list[BatchTiming], batches_left: int) -> list[str]:
    """After the first batch: compile the decode step for the rest of the run if what it would save
    outweighs what it costs on this machine (:func:`vlmfast.compile_cache.decide`)."""
    from .compile_cache import decide

    if engine.decoder_name != "vlmfast" or engine.compile_cache is None or not timings or batches_left < 1:
        return []
    first = timings[0]
    if first.steps < 2 or first.decode_s <= 0 or engine.last_shape is None:
        return []
    step_ms = first.decode_s * 1000 / (first.steps - 1)
    verdict = decide(engine.compile_cache.stats(engine.shape_key(engine.last_shape)), device=engine.device,
                     step_ms=step_ms, remaining_steps=batches_left * first.steps)
    if verdict.compile:
        engine.compile = True
        engine.forget_shapes()  # later batches build compiled decode steps
    return [verdict.reason]


def score_rows(rows: list[SampleResult], truths: dict, options: InferOptions) -> None:
    """The scoring fields of each row (nulls where there is no ground truth; see vlmfast.scoring)."""
    from .scoring import score_row

    for r in rows:
        truth, scorer = truths.get(r.id, (None, None))
        r.extra = score_row(r.record(), truth, scorer or options.scorer, iou=options.iou, bbox_space=options.bbox_space)


CPU_BATCH_SIZE = 32  # measured on 2 cores with prefill in groups: decode keeps gaining up to 32 rows (benchmarks/RESULTS.md)


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
