"""What a run did, in the report's figures: :class:`InferReport` and :func:`summarize`, for both
engines. Clocks become phase figures in :func:`vlmfast.timing.summarize_timings`; rows become
accuracy in :func:`vlmfast.scoring.summarize`; decode bytes become bandwidth in :mod:`vlmfast.capacity`."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from .engine import BatchTiming, SampleResult
from .results import read_existing
from .timing import summarize_timings, versions


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
    decode_s: float | None
    ttft_ms_p50: float | None
    ttft_ms_p90: float | None
    decode_ms_per_token: float | None  # per decode step = per token of one sequence
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
    batch_size: int
    batches: int
    max_new_tokens: int
    finish: dict
    no_answer: int  # successful rows without an <answer>…</answer>
    scores: dict  # accuracy, format rate, … over the results file (see vlmfast.scoring.summarize)
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
    results: list[SampleResult] = field(default_factory=list, repr=False)
    batch_timings: list[BatchTiming] = field(default_factory=list, repr=False)

    def as_dict(self) -> dict:
        data = asdict(self)
        data.pop("results")
        data.pop("batch_timings")
        return data


def process_figures(p: dict) -> dict:
    """One process's share of a parallel run."""
    tokens = sum(r.n_new_tokens for r in p["results"] if r.error is None)
    return {"rank": p["rank"], "device": p["device"], "samples": len(p["results"]), "new_tokens": tokens,
            "generate_s": round(p["generate_s"], 4),
            "tokens_per_s": round(tokens / p["generate_s"], 2) if p["generate_s"] > 0 and tokens else None}


def final_rows(out: Path) -> list[dict]:
    """Every row of the finished results file (this run's and earlier runs')."""
    rows, _ = read_existing(out, repair=False)
    return list(rows.values())


def summarize(options, facts, engine, results, timings, *, generate_s, skipped, notes, peak, oom_splits=0,
              compile_s=0.0, scored_rows=()) -> InferReport:
    """The report from what ran. ``facts``: checkpoint, load_s, cache, device, dtype, attn, engine
    (vLLM's settings, or None) and ``loaded`` (the HF engine's model, for the bandwidth figures)."""
    from .stats import summarize as summarize_scores

    ok = [r for r in results if r.error is None]
    if oom_splits:
        notes = notes + [f"out of memory: {oom_splits} batch(es) were halved and retried"]
    new_tokens = sum(r.n_new_tokens for r in ok)
    phases = summarize_timings(timings)
    ran = generate_s > 0 and bool(ok)  # a resume-only run generated nothing: no rate to report
    hf = facts["loaded"] is not None
    run_versions = versions()
    if facts["engine"] is not None:
        run_versions["vllm"] = facts["engine"]["vllm_version"]
        notes = notes + facts["engine"]["notes"] + list(engine.timing_notes)
    return InferReport(
        checkpoint=facts["checkpoint"],
        samples=len(results),
        errors=len(results) - len(ok),
        skipped_existing=skipped,
        new_tokens=new_tokens,
        load_s=round(facts["load_s"], 4),
        compile_s=round(compile_s, 3) if compile_s else None,
        preprocess_s=round(sum(t.preprocess_s for t in timings), 4),
        preprocess_exposed_s=round(sum(t.preprocess_exposed_s or 0.0 for t in timings), 4),
        generate_s=round(generate_s, 4),
        prefill_s=phases["prefill_s"] if timings else None,
        vision_s=phases["vision_s"],
        decode_s=phases["decode_s"] if timings else None,
        ttft_ms_p50=phases["ttft_ms_p50"],
        ttft_ms_p90=phases["ttft_ms_p90"],
        decode_ms_per_token=phases["decode_ms_per_token"],
        tokens_per_s=round(new_tokens / generate_s, 2) if ran else None,
        samples_per_s=round(len(ok) / generate_s, 3) if ran else None,
        peak_mem_mib=round(peak[0], 1),
        peak_mem_kind=peak[1] if hf or facts["device"] == "cpu" else "this process only (vLLM's engine process not counted)",
        cache=facts["cache"],
        device=facts["device"],
        dtype=facts["dtype"],
        attn=facts["attn"],
        engine=options.engine,
        engine_settings=facts["engine"],
        decoder=engine.decoder_name if hf else "vllm",
        cuda_graphs=engine.cuda_graphs if hf else not facts["engine"]["enforce_eager"],
        compiled=engine.compile if hf else False,
        device_syncs=phases["device_syncs"],
        batch_size=options.batch_size,
        batches=len(timings),
        max_new_tokens=options.generation.max_new_tokens,
        finish={"eos": sum(r.finish_reason == "eos" for r in ok), "length": sum(r.finish_reason == "length" for r in ok)},
        no_answer=sum(r.answer is None for r in ok),
        scores=summarize_scores(list(scored_rows)),
        oom_splits=oom_splits,
        max_pixels=engine.max_pixels,
        max_pixels_capped=engine.max_pixels_capped,
        **(_bandwidth(facts["loaded"], ok, timings, phases["decode_ms_per_token"]) if hf else
           {"decode_gb_per_s": None, "peak_gb_per_s": None, "bandwidth_pct_of_peak": None}),
        compile_cache=engine.compile_cache.summary() if hf and engine.compile_cache is not None and engine.compile else None,
        notes=notes,
        versions=run_versions,
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
