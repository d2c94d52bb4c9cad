"""``vlmfast bench``: one workload, several scenarios, side by side — speed and accuracy — with gates for CI.

Scenarios (stable names, the JSON schema depends on them):

- ``ckpt``          vlmfast on the checkpoint: cache forced on, batched (once per ``--batch-sizes`` entry)
- ``ckpt-vllm``     the checkpoint on vLLM (``--engines hf,vllm``), same workload and batch sizes
- ``ckpt-as-saved`` plain HF ``generate`` honouring the checkpoint's saved generation config, one
                    sample at a time — what the user got before vlmfast
- ``base``          vlmfast on the base model, same workload and batch sizes (``--compare-base``)

Each scenario: ``warmup`` untimed runs, then ``repeats`` timed runs of the whole workload. Throughput
figures are medians (and p90) over the timed runs; TTFT percentiles are over every sample of every run.
With ground truth in the manifest, every scenario is scored too, and ckpt − base accuracy comes with a
paired confidence interval.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import statistics
import tempfile
import time
from dataclasses import dataclass, field

from .capacity import run_bandwidth
from .engine import BatchTiming, Engine, GenerationSettings, SampleResult
from .errors import EXIT_CACHE_OFF, EXIT_LESS_ACCURATE, EXIT_SLOWER_THAN_BASE, UsageError
from .timing import now, peak_memory_mib, percentile, reset_peak_memory, summarize_timings

SCHEMA = "vlmfast.bench/2"
CKPT, VLLM, AS_SAVED, BASE = "ckpt", "ckpt-vllm", "ckpt-as-saved", "base"


@dataclass
class BenchOptions:
    ckpt: str
    compare_base: str | None = None
    images: list[str] | None = None
    manifest: str | None = None
    synthetic: int | None = None
    synthetic_size: int = 224
    prompt: str | None = None
    template: str = "plain"
    generation: GenerationSettings = field(default_factory=lambda: GenerationSettings(max_new_tokens=128))
    batch_sizes: tuple[int, ...] = (8,)
    warmup: int = 1
    repeats: int = 3
    as_saved: bool = True
    device: str | None = None
    dtype: str | None = None
    attn: str | None = None
    max_pixels: int | None = None
    min_pixels: int | None = None
    decoder: str = "vlmfast"
    cuda_graphs: bool | None = None
    compile: bool = False  # ckpt and base: torch.compile the decode step (the warm-up runs compile)
    engines: tuple[str, ...] = ("hf",)
    scorer: str = "auto"
    iou: float = 0.5
    bbox_space: str = "resized"


@dataclass
class RunStats:
    """One timed run of the whole workload in one scenario."""

    wall_s: float
    timings: list[BatchTiming]
    results: list[SampleResult]

    @property
    def new_tokens(self) -> int:
        return sum(r.n_new_tokens for r in self.results if r.error is None)


def run_workload(engine: Engine, requests, image_sizes, batch_size: int) -> RunStats:
    """The whole workload once, with per-step clocks on."""
    from .scheduler import Scheduler

    start = now(engine.device)
    timings, results = [], []
    for _, batch_results, t in Scheduler(engine).run(requests, image_sizes, batch_size):
        results.extend(batch_results)
        timings += [t] if t is not None else []  # None: every request of the batch failed (error rows)
    return RunStats(now(engine.device) - start, timings, results)


class AsSavedEngine(Engine):
    """Plain ``generate`` with the checkpoint's generation config exactly as saved (cache off if it
    says so): the same inputs and stop settings as vlmfast, but no ``use_cache`` argument."""

    def __init__(self, loaded, settings, saved_generation_config, **kwargs):
        self.saved_generation_config = saved_generation_config
        super().__init__(loaded, settings, decoder="hf", **kwargs)

    def generate_kwargs(self) -> dict:
        kwargs = super().generate_kwargs()
        kwargs.pop("use_cache")
        return kwargs

    def generate(self, inputs, clock=None):
        model = self.loaded.model
        forced = model.generation_config
        model.generation_config = self.saved_generation_config
        try:
            return super().generate(inputs, clock)
        finally:
            model.generation_config = forced


def saved_generation_config(loaded):
    """The GenerationConfig plain ``from_pretrained`` would have given (before vlmfast forced the cache)."""
    from transformers import GenerationConfig

    from .ckpt_files import read_configs

    # an adapter dir has no config of its own: what plain generate honours is its base's (config_dir)
    _, generation = read_configs(loaded.config_dir)
    if generation is not None:
        return GenerationConfig.from_dict(copy.deepcopy(generation))
    return GenerationConfig.from_model_config(loaded.model.config)


def scenario_summary(name: str, batch_size: int, runs: list[RunStats], tokenizer=None, peak=None) -> dict:
    """Figures for one scenario from its recorded runs. Pure apart from counting think tokens."""
    tps = [r.new_tokens / r.wall_s for r in runs if r.wall_s > 0]
    sps = [sum(x.error is None for x in r.results) / r.wall_s for r in runs if r.wall_s > 0]
    per_run = [summarize_timings(r.timings) for r in runs]
    per_token = [p["decode_ms_per_token"] for p in per_run if p["decode_ms_per_token"] is not None]
    every = summarize_timings([t for r in runs for t in r.timings])  # TTFT over every sample of every run
    last = [r for r in runs[-1].results if r.error is None] if runs else []  # error rows are not samples
    thinks = [r.think for r in last if r.think is not None]
    think_len = [len(tokenizer.encode(t, add_special_tokens=False)) if tokenizer else len(t.split()) for t in thinks]
    n = len(last) or 1
    return {
        "name": name,
        "batch_size": batch_size,
        "runs": len(runs),
        "wall_s_median": _r(statistics.median([r.wall_s for r in runs])) if runs else None,
        "ttft_ms_p50": every["ttft_ms_p50"],
        "ttft_ms_p90": every["ttft_ms_p90"],
        "decode_ms_per_token": _r(statistics.median(per_token)) if per_token else None,
        "tokens_per_s": _r(statistics.median(tps)) if tps else None,
        "tokens_per_s_p90": _r(percentile(tps, 90)),
        "samples_per_s": _r(statistics.median(sps), 4) if sps else None,
        "mean_new_tokens": _r(sum(r.n_new_tokens for r in last) / n),
        "mean_think_tokens": _r(sum(think_len) / len(think_len)) if think_len else None,
        "no_answer_rate": _r(sum(r.answer is None for r in last) / n, 4),
        "truncation_rate": _r(sum(r.finish_reason == "length" for r in last) / n, 4),
        "peak_mem_mib": _r(peak[0], 1) if peak else None,
        "peak_mem_kind": peak[1] if peak else None,
        "step_ms": step_series(runs),
    }


def step_series(runs: list[RunStats]) -> list[float]:
    """Median latency of decode step k over every batch of every run: the per-step plot's line."""
    by_step: dict[int, list[float]] = {}
    for run in runs:
        for timing in run.timings:
            for k, s in enumerate(timing.step_times_s):
                by_step.setdefault(k, []).append(s * 1000)
    return [_r(statistics.median(by_step[k])) for k in sorted(by_step)]


def agreement(a: list[SampleResult], b: list[SampleResult]) -> float | None:
    """Share of samples (matched by id) whose generated token ids are identical."""
    other = {r.id: r.token_ids for r in b}
    shared = [r for r in a if r.id in other]
    return None if not shared else sum(r.token_ids == other[r.id] for r in shared) / len(shared)


def first_difference(a: list[SampleResult], b: list[SampleResult]) -> dict | None:
    """The first sample (in ``a``'s order) whose tokens differ: its id, where, and both texts."""
    other = {r.id: r for r in b}
    for r in a:
        if r.id in other and r.token_ids != other[r.id].token_ids:
            at = next((i for i, (x, y) in enumerate(zip(r.token_ids, other[r.id].token_ids)) if x != y),
                      min(len(r.token_ids), len(other[r.id].token_ids)))
            return {"id": r.id, "token_index": at, "a": r.text, "b": other[r.id].text}
    return None


def score_results(results: list[SampleResult], truths: dict, options: BenchOptions) -> list[dict]:
    """Rows with their scoring fields (see :mod:`vlmfast.scoring`)."""
    from .scoring import rescore

    return rescore([r.record() for r in results], truths, default_scorer=options.scorer, iou=options.iou,
                   bbox_space=options.bbox_space)


def ratio(numerator, denominator):
    return None if not numerator or not denominator else _r(numerator / denominator)


def gate(report: dict, fail_if_slower: float | None, fail_on_cache_off: bool,
         fail_if_less_accurate: float | None = None) -> tuple[int, list[str]]:
    """Exit code and messages for the CI gates: 3 when ckpt tokens/s < base tokens/s ÷ X (checked
    first), 5 when ckpt accuracy < base accuracy − X, 4 when the saved checkpoint has the cache off
    anywhere, else 0. Every tripped gate gets its message."""
    messages, codes = [], []
    pairs = [(s, b) for s in report["scenarios"] if s["name"] == CKPT
             for b in report["scenarios"] if b["name"] == BASE and b["batch_size"] == s["batch_size"]]
    if (fail_if_slower is not None or fail_if_less_accurate is not None) and not pairs:
        return 2, ["--fail-if-slower / --fail-if-less-accurate need --compare-base: no base figures to compare with"]
    for s, b in pairs if fail_if_slower is not None else ():
        limit = b["tokens_per_s"] / fail_if_slower
        if s["tokens_per_s"] < limit:
            messages.append(f"ckpt at batch {s['batch_size']}: {s['tokens_per_s']:.1f} tokens/s < base "
                            f"{b['tokens_per_s']:.1f} ÷ {fail_if_slower} = {limit:.1f}")
            codes.append(EXIT_SLOWER_THAN_BASE)
    for s, b in pairs if fail_if_less_accurate is not None else ():
        if s.get("accuracy") is None or b.get("accuracy") is None:
            messages.append(f"--fail-if-less-accurate: no ground truth scored at batch {s['batch_size']} (give a --manifest with solution/answer)")
            codes.append(2)
        elif s["accuracy"] < b["accuracy"] - fail_if_less_accurate:
            messages.append(f"ckpt at batch {s['batch_size']}: accuracy {s['accuracy']:.3f} < base {b['accuracy']:.3f} "
                            f"− {fail_if_less_accurate} = {b['accuracy'] - fail_if_less_accurate:.3f}")
            codes.append(EXIT_LESS_ACCURATE)
    if fail_on_cache_off and report["cache"]["found_off"]:
        messages.append("the checkpoint's saved config turns the KV cache off in: " + ", ".join(report["cache"]["found_off"]))
        codes.append(EXIT_CACHE_OFF)
    return (codes[0] if codes else 0), messages


def apply_gates(report: dict, fail_if_slower: float | None, fail_on_cache_off: bool,
                fail_if_less_accurate: float | None = None) -> int:
    """Evaluate the CI gates, record them in ``report["gates"]`` and return the exit code."""
    code, messages = gate(report, fail_if_slower, fail_on_cache_off, fail_if_less_accurate)
    report["gates"] = {"fail_if_slower": fail_if_slower, "fail_on_cache_off": fail_on_cache_off,
                       "fail_if_less_accurate": fail_if_less_accurate, "exit_code": code, "messages": messages}
    return code


def _r(value, digits=3):
    return None if value is None else round(value, digits)


class _Noop:
    def start(self, total):
        pass

    def advance(self, samples, tokens):
        pass


def run_bench(options: BenchOptions, progress=None, say=lambda text: None) -> dict:
    """Run every scenario and return the report dict (the ``--json`` schema)."""
    progress = progress or _Noop()
    with tempfile.TemporaryDirectory(prefix="vlmfast-synthetic-") as scratch:  # synthetic images live as long as the run
        return _run_bench(options, progress, say, scratch)


def _run_bench(options: BenchOptions, progress, say, scratch: str) -> dict:
    from .checkpoint import load
    from .compile_cache import CompileCache
    from .locate import locate
    from .timing import versions

    if options.compile and options.warmup < 1:
        raise UsageError("--compile needs a warm-up run to compile outside the clock", hint="use --warmup 1 or more")
    found = locate(options.ckpt, hub=True)
    base_found = locate(options.compare_base, hub=True) if options.compare_base else None
    requests, sizes = _workload(options, scratch)
    truths = {r.id: (r.truth, r.scorer) for r in requests}
    settings = options.generation
    common = dict(min_pixels=options.min_pixels, max_pixels=options.max_pixels, record_steps=True)
    compile_cache = CompileCache(versions()) if options.compile else None
    if compile_cache is not None:
        compile_cache.activate()  # before the model loads
    fast = dict(common, decoder=options.decoder, cuda_graphs=options.cuda_graphs, compile=options.compile,
                compile_cache=compile_cache)
    scenarios: list[dict] = []
    rows: dict[tuple[str, int], list[SampleResult]] = {}

    def measure(name, run, batch_size, tokenizer, loaded=None):
        """``run()`` does the whole workload once and returns its RunStats."""
        say(f"{name} (batch {batch_size}): {options.warmup} warm-up + {options.repeats} timed runs")
        for _ in range(options.warmup):
            run()
        device = loaded.runtime.device if loaded is not None else "cpu"
        reset_peak_memory(device)
        runs = []
        for _ in range(options.repeats):
            runs.append(run())
            progress.advance(1, runs[-1].new_tokens)
        rows[(name, batch_size)] = runs[-1].results
        summary = scenario_summary(name, batch_size, runs, tokenizer, peak_memory_mib(device))
        ok = [r for r in runs[-1].results if r.error is None]
        if loaded is not None:
            context = sum(r.n_prompt_tokens + r.n_new_tokens / 2 for r in ok) / len(ok) if ok else 0
            summary.update(run_bandwidth(loaded, min(batch_size, len(ok) or 1), context, summary["decode_ms_per_token"]))
        else:  # vLLM's model lives in its own process: no weights here to count bytes from
            summary.update(decode_gb_per_s=None, peak_gb_per_s=None, bandwidth_pct_of_peak=None)
        summary.update(_accuracy(score_results(runs[-1].results, truths, options)))
        scenarios.append(summary)

    engines = [e for e in options.engines if e in ("hf", "vllm")]
    total = options.repeats * (len(options.batch_sizes) * (len(engines) + bool(options.compare_base)) + options.as_saved)
    progress.start(total)
    notes: list[str] = []
    loaded = load(found, device=options.device, dtype=options.dtype, attn=options.attn)
    cache = loaded.cache.as_dict()
    notes += loaded.notes
    tokenizer = loaded.processor.tokenizer
    def on(engine, bs):
        return lambda: run_workload(engine, requests, sizes, bs)

    if "hf" in engines:
        for bs in options.batch_sizes:
            measure(CKPT, on(Engine(loaded, settings, **fast), bs), bs, tokenizer, loaded)
    if options.as_saved:
        measure(AS_SAVED, on(AsSavedEngine(loaded, settings, saved_generation_config(loaded), **common), 1), 1, tokenizer, loaded)
    del loaded
    _free_memory()
    if "vllm" in engines:
        with vllm_workload(found, options, requests, sizes) as (run_vllm, described):
            notes.append(f"vLLM {described['vllm_version']}: start-up {described['startup_s']} s (not timed), "
                         f"dtype {described['dtype']}, enforce_eager {described['enforce_eager']}")
            notes += described["notes"]
            for bs in options.batch_sizes:
                measure(VLLM, lambda bs=bs: run_vllm(bs), bs, tokenizer)
        _free_memory()
    base_cache = None
    if base_found is not None:
        base = load(base_found, device=options.device, dtype=options.dtype, attn=options.attn)
        base_cache = base.cache.as_dict()
        for bs in options.batch_sizes:
            measure(BASE, on(Engine(base, settings, **fast), bs), bs, base.processor.tokenizer, base)
        del base
        _free_memory()
    return _report(options, requests, scenarios, rows, truths, cache, base_cache, notes, versions())


@contextlib.contextmanager
def vllm_workload(found, options: BenchOptions, requests, sizes):
    """(run(batch_size) → RunStats, vLLM's settings) on the checkpoint, vLLM started once, outside
    every clock; vLLM stopped and its checkpoint overlay removed on exit."""
    from .vllm_engine import VllmEngine

    engine = VllmEngine(found.source, options.generation, min_pixels=options.min_pixels, max_pixels=options.max_pixels,
                        dtype=None if options.dtype in (None, "auto") else options.dtype)
    try:
        engine.start(requests)

        def run(batch_size: int) -> RunStats:
            start = time.perf_counter()
            timings, results = [], []
            for _, rows, timing in engine.run(requests, sizes, batch_size):
                results += rows
                timings += [timing] if timing is not None else []
            return RunStats(time.perf_counter() - start, timings, results)

        yield run, engine.describe()
    finally:
        engine.close()


def _accuracy(scored: list[dict]) -> dict:
    from .stats import summarize

    s = summarize(scored)
    return {"accuracy": s["accuracy"], "format_rate": s["format_rate"], "scored": s["scored"]}


def _report(options, requests, scenarios, rows, truths, cache, base_cache, notes, versions_) -> dict:
    from .stats import paired_comparison

    settings = options.generation
    by = {(s["name"], s["batch_size"]): s for s in scenarios}
    ratios, accuracy = {}, {}
    for bs in options.batch_sizes:
        ck = by.get((CKPT, bs))
        if ck is None:
            continue
        if (BASE, bs) in by:
            ratios[f"ckpt_vs_base@{bs}"] = {"tokens_per_s": ratio(ck["tokens_per_s"], by[(BASE, bs)]["tokens_per_s"])}
            if ck.get("scored"):
                scores = {name: {r["id"]: r["score"] for r in score_results(rows[(name, bs)], truths, options)}
                          for name in (CKPT, BASE)}
                accuracy[f"ckpt_vs_base@{bs}"] = paired_comparison(scores[CKPT], scores[BASE])
        if (AS_SAVED, 1) in by:
            ratios[f"ckpt_vs_as_saved@{bs}"] = {
                "tokens_per_s": ratio(ck["tokens_per_s"], by[(AS_SAVED, 1)]["tokens_per_s"]),
                "wall_s": ratio(by[(AS_SAVED, 1)]["wall_s_median"], ck["wall_s_median"]),
            }
        if (VLLM, bs) in by:
            ratios[f"vllm_vs_ckpt@{bs}"] = {"tokens_per_s": ratio(by[(VLLM, bs)]["tokens_per_s"], ck["tokens_per_s"])}
    fidelity, differences = {}, {}
    small, large = min(options.batch_sizes), max(options.batch_sizes)
    if settings.greedy:
        pairs = [("batch_1_vs_n", (CKPT, 1), (CKPT, large)) if small == 1 and large > 1 else None,
                 ("ckpt_vs_as_saved", (CKPT, small), (AS_SAVED, 1)),
                 ("hf_vs_vllm", (CKPT, small), (VLLM, small))]
        for name, a, b in filter(None, pairs):
            if a in rows and b in rows:
                fidelity[name] = agreement(rows[a], rows[b])
                differences[name] = first_difference(rows[a], rows[b])
    return {
        "schema": SCHEMA,
        "checkpoint": options.ckpt,
        "base": options.compare_base,
        "workload": {"samples": len(requests), "max_new_tokens": settings.max_new_tokens, "ignore_eos": settings.ignore_eos,
                     "decoder": options.decoder, "compile": options.compile, "engines": list(options.engines),
                     "greedy": settings.greedy, "batch_sizes": list(options.batch_sizes), "warmup": options.warmup,
                     "repeats": options.repeats, "with_ground_truth": sum(t[0] is not None for t in truths.values())},
        "cache": cache,
        "base_cache": base_cache,
        "scenarios": scenarios,
        "ratios": ratios,
        "accuracy": accuracy,
        "fidelity": fidelity,
        "first_difference": {k: v for k, v in differences.items() if v is not None},
        "notes": notes,
        "versions": versions_,
    }


def _free_memory() -> None:
    """Drop the first model before loading the next, so base and ckpt never share the GPU."""
    gc.collect()
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except ImportError:
        pass


def _workload(options: BenchOptions, scratch: str):
    from .inputs import collect, raise_for_problems

    images = list(options.images or [])
    if options.synthetic:
        from .tiny import make_images

        size = options.synthetic_size
        images += [str(p) for p in make_images(scratch, n=options.synthetic, sizes=[(size, size)])]
    collected = collect(images=images or None, prompt=options.prompt or "Describe this image.",
                        manifest=options.manifest, template=options.template)
    raise_for_problems(collected)
    return collected.requests, collected.image_sizes
