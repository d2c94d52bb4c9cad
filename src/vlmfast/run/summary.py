"""What a run did, in the report's figures: :class:`InferReport` and :func:`summarize`, for every
engine (what differs between engines comes in :class:`~vlmfast.engines.contract.EngineFacts`). Clocks become phase figures in :func:`vlmfast.timing.summarize_timings`; rows become
accuracy in :func:`vlmfast.evaluation.stats.summarize`; decode bytes become bandwidth in :mod:`vlmfast.engines.hf.capacity`."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from vlmfast.engines.facts import EngineFacts
from vlmfast.engines.rows import BatchTiming, SampleResult
from vlmfast.timing import summarize_timings, versions


@dataclass
class InferReport:
    """Everything ``--json`` prints. Times in seconds (``_s``) or milliseconds (``_ms``)."""

    checkpoint: str
    samples: int  # rows produced by this run (errors included)
    errors: int
    skipped_existing: int  # ids already in --out from an earlier run
    new_tokens: int
    load_s: float
    compile_s: float | None  # compiling and capturing the decode step, kept out of generate_s
    preprocess_s: float  # all preprocessing work
    preprocess_exposed_s: float  # the part generation waited for (the rest overlapped decoding)
    generate_s: float  # wall time after loading, compile_s excluded: preprocess + prefill + decode + writing
    prefill_s: float | None  # vision tower + prompt + first token, summed over batches
    vision_s: float | None  # the vision tower's part of prefill_s
    cache_fill_s: float | None  # prefill caches copied into decode rows, after the first token (not in prefill_s)
    decode_s: float | None
    ttft_ms_p50: float | None
    ttft_ms_p90: float | None
    decode_ms_per_token: float | None  # per decode step = per token of one sequence
    decode_steps: int | None  # the decode steps decode_s was spent on (after each answer's first token)
    decode_row_utilization: float | None  # answer tokens ÷ decode rows computed over the steps (row-steps)
    tokens_per_s: float | None
    samples_per_s: float | None
    peak_mem_mib: float
    peak_mem_kind: str
    cache: dict
    device: str
    dtype: str
    attn: str
    engine: str  # "hf" | "vllm"
    engine_settings: dict | None  # --engine vllm: vLLM's version and settings
    decoder: str
    cuda_graphs: bool
    compiled: bool
    device_syncs: int  # host read-backs in decode loops (EOS checks)
    batch_size: int  # decode rows (continuous batching) or answers per batch (static batches)
    batches: int  # batches run, or admissions into freed rows (continuous batching)
    batching: str  # "continuous" | "static"
    max_new_tokens: int
    finish: dict
    no_answer: int  # successful rows without an <answer>…</answer>
    scores: dict  # accuracy, format rate, … over the results file (see vlmfast.evaluation.stats.summarize)
    oom_splits: int  # batches halved after a CUDA out-of-memory error
    max_pixels: int | None
    max_pixels_capped: bool
    decode_gb_per_s: float | None  # LM weights + KV cache read per decode step ÷ step time
    peak_gb_per_s: float | None  # the device's datasheet peak (CUDA devices vlmfast knows)
    bandwidth_pct_of_peak: float | None
    compile_cache: dict | None
    notes: list[str]
    versions: dict
    out: str | None
    processes: list[dict] = field(default_factory=list)  # per-process figures of a multi-process run
    parity: dict | None = None  # training settings beside the checkpoint vs this run's (vlmfast.run.parity)
    fingerprint: dict | None = None  # the weights evaluated (vlmfast.checkpoints.fingerprint); None: not a local dir
    results: list[SampleResult] = field(default_factory=list, repr=False)
    batch_timings: list[BatchTiming] = field(default_factory=list, repr=False)

    def as_dict(self) -> dict:
        data = asdict(self)
        data.pop("results")
        data.pop("batch_timings")
        return data


@dataclass
class Share:
    """One process's part of a run: its rows, its batches' clocks, its wall time and peak memory."""

    rank: int
    device: str
    results: list[SampleResult] = field(default_factory=list)
    timings: list[BatchTiming] = field(default_factory=list)
    wall_s: float = 0.0
    peak: tuple[float, str] = (0.0, "none")

    def figures(self) -> dict:
        """This process's figures in a parallel run's report."""
        tokens = sum(r.n_new_tokens for r in self.results if r.error is None and not r.copied)
        return {"rank": self.rank, "device": self.device, "samples": len(self.results), "new_tokens": tokens,
                "generate_s": round(self.wall_s, 4),
                "tokens_per_s": round(tokens / self.wall_s, 2) if self.wall_s > 0 and tokens else None}


def summarize(options, facts: EngineFacts, shares: list[Share], work, *, rows: list[dict], batch_size: int,
              scores_of=None) -> InferReport:
    """The report from what ran: ``facts`` about the engine, every process's :class:`Share`, the run's
    :class:`~vlmfast.run.runner.Work` (skipped ids, notes) and ``rows``, every row of the results (this run's
    and, with ``--out``, earlier runs'), over which accuracy is computed (by ``scores_of``, else
    :func:`vlmfast.evaluation.stats.summarize`)."""
    from vlmfast.evaluation.stats import summarize as summarize_scores

    position = {rid: i for i, rid in enumerate(work.order)}
    results = sorted((r for s in shares for r in s.results), key=lambda r: position.get(r.id, len(position)))
    timings = [t for s in shares for t in s.timings]
    ok = [r for r in results if r.error is None]
    # compiling and capturing are not generating: out of the wall time once, here
    generate_s = max(0.0, max(s.wall_s for s in shares) - facts.compile_s)
    notes = work.notes + facts.notes
    if options.generation.n > 1:
        from vlmfast.evaluation.samples import identical_answers_note

        same = identical_answers_note(rows, options.generation.temperature)
        notes = notes + ([same] if same else [])
    if facts.oom_splits:
        notes = notes + [f"out of memory: {facts.oom_splits} batch(es) were halved and retried"]
    # the cap is news only when an image was larger than it (small images were never touched)
    capped = facts.max_pixels_capped and any(w * h > facts.max_pixels for r in results for w, h in r.image_sizes or [])
    if capped:
        notes = [f"max_pixels capped at {facts.max_pixels} (the checkpoint's processor allows more; raise it "
                 "with --max-pixels)"] + notes
    new_tokens = sum(r.n_new_tokens for r in ok if not r.copied)  # a greedy answer copied to other samples: once
    phases = summarize_timings(timings)
    ran = generate_s > 0 and bool(ok)  # a resume-only run generated nothing: no rate to report
    peak = max((s.peak for s in shares), key=lambda x: x[0])
    return InferReport(
        checkpoint=facts.checkpoint,
        samples=len(results),
        errors=len(results) - len(ok),
        skipped_existing=work.skipped,
        new_tokens=new_tokens,
        load_s=round(facts.load_s, 4),
        compile_s=round(facts.compile_s, 3) if facts.compile_s else None,
        preprocess_s=round(sum(t.preprocess_s for t in timings), 4),
        preprocess_exposed_s=round(sum(t.preprocess_exposed_s or 0.0 for t in timings), 4),
        generate_s=round(generate_s, 4),
        prefill_s=phases["prefill_s"] if timings else None,
        vision_s=phases["vision_s"],
        cache_fill_s=phases["cache_fill_s"],
        decode_s=phases["decode_s"] if timings else None,
        ttft_ms_p50=phases["ttft_ms_p50"],
        ttft_ms_p90=phases["ttft_ms_p90"],
        decode_ms_per_token=phases["decode_ms_per_token"],
        decode_steps=phases["decode_steps"] if timings else None,
        decode_row_utilization=_utilization(ok, timings),
        tokens_per_s=round(new_tokens / generate_s, 2) if ran else None,
        samples_per_s=round(len(ok) / generate_s, 3) if ran else None,
        peak_mem_mib=round(peak[0], 1),
        peak_mem_kind=facts.peak_mem_kind or peak[1],
        cache=facts.cache,
        device=facts.device,
        dtype=facts.dtype,
        attn=facts.attn,
        engine=facts.engine,
        engine_settings=facts.settings,
        decoder=facts.decoder,
        cuda_graphs=facts.cuda_graphs,
        compiled=facts.compiled,
        device_syncs=phases["device_syncs"],
        batch_size=batch_size,
        batching="continuous" if any(t.size == 0 and t.row_steps for t in timings) else "static",
        batches=sum(t.size > 0 for t in timings),  # continuous batching: admissions (its decode loop is a timing of size 0)
        max_new_tokens=options.generation.max_new_tokens,
        finish={"eos": sum(r.finish_reason == "eos" for r in ok), "length": sum(r.finish_reason == "length" for r in ok)},
        no_answer=sum(r.answer is None for r in ok),
        scores=(scores_of or summarize_scores)(list(rows)),
        oom_splits=facts.oom_splits,
        max_pixels=facts.max_pixels,
        max_pixels_capped=capped,
        **_bandwidth(facts, ok, timings, phases["decode_ms_per_token"]),
        compile_cache=facts.compile_cache,
        notes=notes,
        versions={**versions(), **facts.versions},
        out=options.out,
        results=results,
        batch_timings=timings,
    )


def _utilization(ok, timings) -> float | None:
    """Answer tokens ÷ the decode rows computed, summed over steps (each answer's first token counts one
    row-step: it came from prefill). A static batch computes its ended rows until its longest answer
    ends; continuous batching gives them the next request. None where the engine does not count."""
    row_steps = sum(t.row_steps for t in timings)
    return round(sum(r.n_new_tokens for r in ok if not r.copied) / row_steps, 4) if row_steps else None


def _bandwidth(facts: EngineFacts, ok, timings, decode_ms_per_token) -> dict:
    """Achieved decode bandwidth at the run's mean batch and mid-decode context (:mod:`vlmfast.engines.hf.capacity`)."""
    from vlmfast.engines.bandwidth import bandwidth_report

    if facts.model_shape is None or not ok or not timings or not decode_ms_per_token:
        return {"decode_gb_per_s": None, "peak_gb_per_s": None, "bandwidth_pct_of_peak": None}
    steps = sum(max(t.steps - 1, 0) for t in timings)  # the decode steps decode_ms_per_token is over
    # an admission's timing (continuous batching) decodes nothing: it adds no steps and no rows
    row_steps = sum(t.decode_row_steps for t in timings)
    # the rows a decode step computed on average: counted where the engine counts them, else the batch size
    batch = row_steps / steps if row_steps and steps else sum(t.size for t in timings) / len(timings)
    context = sum(r.n_prompt_tokens + r.n_new_tokens / 2 for r in ok) / len(ok)
    return bandwidth_report(facts.model_shape, batch, context, decode_ms_per_token / 1000, facts.device_name)
