"""``vlmfast bench``: one workload, several scenarios, side by side — speed and accuracy — with gates for CI.

Scenarios (stable names, the JSON schema depends on them):

- ``ckpt``          vlmfast on the checkpoint: cache forced on, batched (once per ``--batch-sizes`` entry)
- ``ckpt-vllm``     the checkpoint on vLLM (``--engines hf,vllm``), same workload and batch sizes; any other
                    engine of :data:`~vlmfast.engines.open.ENGINES` likewise, as ``ckpt-<engine>``
- ``ckpt-as-saved`` plain HF ``generate`` honouring the checkpoint's saved generation config, one
                    sample at a time — what the user got before vlmfast
- ``base``          vlmfast on the base model, same workload and batch sizes (``--compare-base``)

Each scenario: ``warmup`` untimed runs, then ``repeats`` timed runs of the whole workload. Throughput
figures are medians (and p90) over the timed runs, with the runs' spread (a note when they disagree);
TTFT percentiles are over every sample of every run. With ground truth in the manifest, every scenario
is scored too, and ckpt − base accuracy comes with a paired confidence interval. The figures are
:mod:`vlmfast.run.bench_figures`' arithmetic on the recorded runs. The options, :class:`BenchOptions`, live in
:mod:`vlmfast.run.bench_options`, which ``--help`` imports without the rest of the bench.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field

from vlmfast.run.bench_figures import (
    AS_SAVED, BASE, CKPT, SCHEMA, RunStats, agreement, apply_gates, fidelity_pairs, first_difference,
    noise_notes, scenario_name, scenario_summary, speed_ratios, warmup_notes,
)
from vlmfast.engines.bandwidth import run_bandwidth
from vlmfast.engines.contract import Backend
from vlmfast.engines.open import ENGINES
from vlmfast.engines.rows import SampleResult, row_key
from vlmfast.run.bench_options import BenchOptions
from vlmfast.run.options import InferOptions
from vlmfast.timing import free_memory, now, peak_memory_mib, reset_peak_memory


def run_workload(backend: Backend, requests, image_sizes, batch_size: int) -> RunStats:
    """The whole workload once through any engine's :class:`~vlmfast.engines.contract.Backend`, as the
    runner drives it. ``batch_size`` counts answers (with n answers per request, batch_size // n requests
    a batch), as in ``infer``."""
    compiled = _compile_s(backend)
    start = now(backend.device)
    timings, results = [], []
    for parts in backend.batches(requests, image_sizes, backend.plan(requests, image_sizes, batch_size)):
        for _, batch_results, t in parts:
            results.extend(batch_results)
            timings += [t] if t is not None else []  # None: every request of the batch failed (error rows)
    wall = now(backend.device) - start
    return RunStats(wall, timings, results, compile_s=_compile_s(backend) - compiled)


def _compile_s(backend) -> float:
    """Seconds the backend's engine has spent compiling and capturing decode shapes so far (0: it keeps none)."""
    policy = getattr(getattr(backend, "engine", None), "policy", None)
    return float(getattr(policy, "compile_s", 0.0) or 0.0)


def score_results(results: list[SampleResult], truths: dict, options: BenchOptions) -> list[dict]:
    """Rows with their scoring fields (see :mod:`vlmfast.evaluation.scoring`)."""
    from vlmfast.evaluation.scoring import rescore

    return rescore([r.record() for r in results], truths, default_scorer=options.scorer, iou=options.iou,
                   bbox_space=options.bbox_space)


class _Noop:
    def start(self, total):
        pass

    def mark(self):
        pass

    def advance(self, samples, tokens):
        pass


def run_bench(options: BenchOptions, progress=None, say=lambda text: None) -> dict:
    """Run every scenario and return the report dict (the ``--json`` schema), its CI gates evaluated:
    ``report["gates"]["exit_code"]`` is what the command exits with."""
    from vlmfast.run.parallel import refuse_launched

    refuse_launched("bench")
    progress = progress or _Noop()
    with tempfile.TemporaryDirectory(prefix="vlmfast-synthetic-") as scratch:  # synthetic images live as long as the run
        report = _run_bench(options, progress, say, scratch)
    apply_gates(report, options.fail_if_slower, options.fail_on_cache_off, options.fail_if_less_accurate)
    return report


@dataclass
class _Bench:
    """One bench run's workload and what its scenarios recorded."""

    options: BenchOptions
    requests: list
    sizes: dict
    progress: object
    say: object
    truths: dict = field(default_factory=dict)
    scenarios: list[dict] = field(default_factory=list)
    rows: dict[tuple[str, int], list[SampleResult]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    tokenizer: object = None  # the checkpoint's: think and answer token counts on every engine

    def measure(self, name: str, backend: Backend, batch_size: int, tokenizer, loaded=None, compiles=True) -> None:
        """Warm-up runs, then timed runs of the whole workload on ``backend``; the scenario's figures.
        ``compiles``: the engine takes ``--compile`` (vlmfast's), so a step that ran uncompiled is said."""
        self.measure_together([(name, backend, tokenizer, loaded)], batch_size, compiles)

    def measure_together(self, sides: list[tuple], batch_size: int, compiles=True) -> None:
        """Like :meth:`measure` for several scenarios ``(name, backend, tokenizer, loaded)`` whose timed runs
        alternate (a, b, a, b, …): a machine that drifts (clocks, another process) moves both sides of a ratio
        alike, where blocks of runs would put the drift into the ratio."""
        o = self.options
        for name, backend, _, _ in sides:
            self.say(f"{name} (batch {batch_size}): {o.warmup} warm-up + {o.repeats} timed runs"
                     + (" (interleaved with " + ", ".join(n for n, *_ in sides if n != name) + ")" if len(sides) > 1 else ""))
            for _ in range(o.warmup):
                run_workload(backend, self.requests, self.sizes, batch_size)
        loaded = next((s[3] for s in sides if s[3] is not None), None)
        device = loaded.runtime.device if loaded is not None else "cpu"
        reset_peak_memory(device)
        runs: dict[str, list[RunStats]] = {name: [] for name, *_ in sides}
        self.progress.mark()  # the rate shown is the timed runs', not the load's and warm-up's
        for _ in range(o.repeats):
            for name, backend, _, _ in sides:
                runs[name].append(run_workload(backend, self.requests, self.sizes, batch_size))
                self.progress.advance(1, runs[name][-1].new_tokens)
        peak = peak_memory_mib(device)  # with several sides: of all of them together
        for name, backend, tokenizer, loaded in sides:
            self._record(name, backend, batch_size, runs[name], tokenizer, loaded, compiles, peak)

    def _record(self, name, backend, batch_size, runs, tokenizer, loaded, compiles, peak) -> None:
        o = self.options
        self.rows[(name, batch_size)] = runs[-1].results
        summary = scenario_summary(name, batch_size, runs, tokenizer, peak)
        ok = [r for r in runs[-1].results if r.error is None]
        if loaded is not None:
            context = sum(r.n_prompt_tokens + r.n_new_tokens / 2 for r in ok) / len(ok) if ok else 0
            summary.update(run_bandwidth(loaded, min(batch_size, len(ok) or 1), context, summary["decode_ms_per_token"]))
        else:  # vLLM's model lives in its own process: no weights here to count bytes from
            summary.update(decode_gb_per_s=None, peak_gb_per_s=None, bandwidth_pct_of_peak=None)
        summary.update(_accuracy(score_results(runs[-1].results, self.truths, o)))
        facts = backend.facts()
        if facts.peak_mem_kind is not None:  # the engine's memory is in its own processes, which this figure misses
            own = summary["peak_mem_mib"]
            self.notes.append(f"{name} (batch {batch_size}): peak memory not shown: {facts.peak_mem_kind}"
                              + (f"; this process's own peak was {own} MiB" if own is not None else ""))
            summary.update(peak_mem_mib=None, peak_mem_kind=facts.peak_mem_kind)
        summary["compiled"] = facts.compiled  # what ran, not what was asked: a failed compile falls back
        if o.compile and compiles and not facts.compiled:
            why = [n for n in facts.notes if "compile" in n.lower()]
            self.notes.append(f"{name} (batch {batch_size}): --compile was asked, the decode step ran uncompiled"
                              + (f" ({'; '.join(why)})" if why else ""))
        self.scenarios.append(summary)


def _run_bench(options: BenchOptions, progress, say, scratch: str) -> dict:
    from vlmfast.checkpoints.locate import locate
    from vlmfast.engines.hf.compile_policy import prepare_cache
    from vlmfast.timing import versions

    found = locate(options.ckpt, hub=True)
    base_found = locate(options.compare_base, hub=True, option="--compare-base") if options.compare_base else None
    requests, sizes = _workload(options, scratch)
    bench = _Bench(options, requests, sizes, progress, say, truths={r.id: r.truth_record() for r in requests})
    compile_cache = prepare_cache(options.decoder, True) if options.compile else None  # before the model loads
    n_engines = len(options.engines) + bool(options.compare_base)
    progress.start(options.repeats * (len(options.batch_sizes) * n_engines + options.as_saved))
    cache, base_cache = _checkpoint_scenarios(bench, found, compile_cache, base_found)
    for engine in (e for e in options.engines if e != "hf"):
        _opened_scenarios(bench, engine, found)
    if base_found is not None and base_cache is None:  # not measured beside the checkpoint: after it
        base_cache = _engine_scenarios(bench, BASE, base_found, compile_cache)
    order = {CKPT: 0, AS_SAVED: 1, BASE: 3}  # as documented: the checkpoint's, as saved, other engines, the base
    bench.scenarios.sort(key=lambda s: order.get(s["name"], 2))  # stable: batch sizes keep their order
    return _report(options, requests, bench.scenarios, bench.rows, bench.truths, cache, base_cache, bench.notes,
                   versions())


def _engine_kwargs(options: BenchOptions, compile_cache) -> tuple[dict, dict]:
    """The keywords of the as-saved reference and of vlmfast's engine: per-step clocks on for both."""
    common = dict(min_pixels=options.min_pixels, max_pixels=options.max_pixels, resize_rule=options.resize_rule,
                  record_steps=True)
    fast = dict(common, decoder=options.decoder, cuda_graphs=options.cuda_graphs, compile=options.compile,
                compile_cache=compile_cache)
    return common, fast


def _checkpoint_scenarios(bench: _Bench, found, compile_cache, base_found=None) -> tuple[dict, dict | None]:
    """The checkpoint on vlmfast's engine at each batch size (``--engines`` with hf), and plain generate
    as saved at batch 1 (``--as-saved``). With ``base_found`` (``--compare-base``) the base is loaded beside
    the checkpoint when both fit, and their timed runs alternate. Returns the checkpoint's cache report and
    the base's (None: the base was not measured here); the models are freed."""
    from vlmfast.checkpoints.load import load
    from vlmfast.engines.hf.as_saved import AsSavedEngine, saved_generation_config
    from vlmfast.engines.hf.backend import HfBackend
    from vlmfast.engines.hf.engine import Engine

    o = bench.options
    common, fast = _engine_kwargs(o, compile_cache)
    loaded = load(found, device=o.device, dtype=o.dtype, attn=o.attn)
    bench.notes += loaded.notes
    cache, tokenizer = loaded.cache.as_dict(), loaded.processor.tokenizer
    bench.tokenizer = tokenizer
    base = _load_beside(bench, base_found, loaded) if base_found is not None and "hf" in o.engines else None
    if "hf" in o.engines:
        for bs in o.batch_sizes:
            sides = [(CKPT, HfBackend.around(Engine(loaded, o.generation, **fast)), tokenizer, loaded)]
            if base is not None:
                sides.append((BASE, HfBackend.around(Engine(base, o.generation, **fast)), base.processor.tokenizer, base))
            bench.measure_together(sides, bs)
            del sides  # its engines hold the base: it goes before the as-saved runs
    base_cache = base.cache.as_dict() if base is not None else None
    del base
    if o.as_saved:
        reference = AsSavedEngine(loaded, o.generation, saved_generation_config(loaded), **common)
        bench.measure(AS_SAVED, HfBackend.around(reference), 1, tokenizer, loaded)
    del loaded
    free_memory()
    return cache, base_cache


def _load_beside(bench: _Bench, found, loaded):
    """The base loaded beside the checkpoint when the device has room for both (its weights take what the
    checkpoint's take, and half as much again is left for caches and activations), else None and a note:
    the two are then measured one after the other."""
    from vlmfast.checkpoints.load import load
    from vlmfast.timing import free_bytes

    o = bench.options
    weights = sum(p.numel() * p.element_size() for p in loaded.model.parameters())
    room = free_bytes(loaded.runtime.device)
    if room is None or room < 1.5 * weights:
        bench.notes.append(f"ckpt and base ran one after the other, not interleaved: the base does not fit beside the "
                           f"checkpoint ({weights / 2**30:.1f} GiB of weights, {'unknown' if room is None else f'{room / 2**30:.1f} GiB'} "
                           "free); a machine that drifts between the two shows in their ratio")
        return None
    base = load(found, device=o.device, dtype=o.dtype, attn=o.attn)
    bench.notes.append("ckpt and base loaded side by side, their timed runs interleaved (ckpt, base, ckpt, …); "
                       "peak memory is of both together")
    return base


def _engine_scenarios(bench: _Bench, name: str, found, compile_cache) -> dict:
    """``found`` (the base) on vlmfast's engine at each batch size; its cache report."""
    from vlmfast.checkpoints.load import load
    from vlmfast.engines.hf.backend import HfBackend
    from vlmfast.engines.hf.engine import Engine

    o = bench.options
    loaded = load(found, device=o.device, dtype=o.dtype, attn=o.attn)
    cache = loaded.cache.as_dict()
    for bs in o.batch_sizes:
        engine = Engine(loaded, o.generation, **_engine_kwargs(o, compile_cache)[1])
        bench.measure(name, HfBackend.around(engine), bs, loaded.processor.tokenizer, loaded)
    del loaded
    free_memory()
    return cache


def _opened_scenarios(bench: _Bench, engine: str, found) -> None:
    """The checkpoint on another engine (``--engines``: vLLM, or any in ``ENGINES``) at each batch size,
    opened through :func:`~vlmfast.engines.open.open_backend` as ``infer`` opens it and made ready once,
    outside every clock; closed after (vLLM: its engine process stopped, its overlay removed)."""
    from vlmfast.engines.open import open_backend
    from vlmfast.run.parallel import Distributed

    o = bench.options
    backend = open_backend(_run_options(o, engine), found, None, Distributed())
    try:
        backend.ready(bench.requests, bench.sizes, max(o.batch_sizes))
        facts = backend.facts()
        versions = ", ".join(f"{k} {v}" for k, v in facts.versions.items())
        bench.notes.append(f"{engine}{f' ({versions})' if versions else ''}: ready in {facts.load_s:.1f} s (not timed), "
                           f"dtype {facts.dtype}, CUDA graphs {facts.cuda_graphs}")
        bench.notes += facts.notes
        for bs in o.batch_sizes:
            bench.measure(scenario_name(engine), backend, bs, bench.tokenizer, compiles=False)
    finally:
        backend.close()
    free_memory()


def _run_options(o: BenchOptions, engine: str) -> InferOptions:
    """What ``infer --engine ENGINE`` would be given for this bench: its settings, less those the engine refuses."""
    settings = dict(device=o.device, dtype=o.dtype, attn=o.attn, decoder=o.decoder, cuda_graphs=o.cuda_graphs,
                    compile=o.compile, min_pixels=o.min_pixels, max_pixels=o.max_pixels, template=o.template,
                    resize_rule=o.resize_rule)
    refused = ENGINES[engine].refuses
    return InferOptions(ckpt=o.ckpt, engine=engine, generation=o.generation,
                        **{k: v for k, v in settings.items() if k not in refused})


def _accuracy(scored: list[dict]) -> dict:
    from vlmfast.evaluation.stats import summarize

    s = summarize(scored)
    return {"accuracy": s["accuracy"], "format_rate": s["format_rate"], "scored": s["scored"]}


def request_means(rows: list[dict]) -> dict[str, float | None]:
    """id → the mean score of its answers (None when none was scored)."""
    grouped: dict[str, list] = {}
    for r in rows:
        grouped.setdefault(str(r["id"]), []).append(r.get("score"))
    return {rid: (sum(v) / len(v) if (v := [s for s in scores if s is not None]) else None) for rid, scores in grouped.items()}


def _report(options, requests, scenarios, rows, truths, cache, base_cache, notes, versions_) -> dict:
    from vlmfast.evaluation.stats import paired_comparison

    settings = options.generation
    by = {(s["name"], s["batch_size"]): s for s in scenarios}
    accuracy = {}
    for bs in options.batch_sizes:
        if (BASE, bs) in by and by.get((CKPT, bs), {}).get("scored"):
            # per request (its answers' mean with --n K): the requests are the paired trials, not the answers
            scores = {name: request_means(score_results(rows[(name, bs)], truths, options)) for name in (CKPT, BASE)}
            accuracy[f"ckpt_vs_base@{bs}"] = paired_comparison(scores[CKPT], scores[BASE])
    fidelity, differences = {}, {}
    for name, a, b in fidelity_pairs(options.batch_sizes, options.engines) if settings.greedy else ():
        if a in rows and b in rows:
            fidelity[name] = agreement(rows[a], rows[b])
            differences[name] = first_difference(rows[a], rows[b])
    return {
        "schema": SCHEMA,
        "checkpoint": options.ckpt,
        "base": options.compare_base,
        "workload": {"samples": len(requests), "max_new_tokens": settings.max_new_tokens, "ignore_eos": settings.ignore_eos,
                     "decoder": options.decoder, "compile": options.compile, "engines": list(options.engines),
                     "greedy": settings.greedy, "n": settings.n, "temperature": settings.temperature,
                     "batch_sizes": list(options.batch_sizes), "warmup": options.warmup,
                     "repeats": options.repeats, "with_ground_truth": sum(t["ground_truth"] is not None for t in truths.values())},
        "cache": cache,
        "base_cache": base_cache,
        "scenarios": scenarios,
        "ratios": speed_ratios(by, options.batch_sizes, options.engines),
        "accuracy": accuracy,
        "fidelity": fidelity,
        "first_difference": {k: v for k, v in differences.items() if v is not None},
        "notes": notes + noise_notes(scenarios) + warmup_notes(options.warmup, scenarios),
        "versions": versions_,
    }


def _workload(options: BenchOptions, scratch: str):
    from vlmfast.inputs.requests import collect, raise_for_problems

    images = list(options.images or [])
    if options.synthetic:
        from vlmfast.checkpoints.tiny import make_images

        size = options.synthetic_size
        images += [str(p) for p in make_images(scratch, n=options.synthetic, sizes=[(size, size)])]
    collected = collect(images=images or None, prompt=options.prompt or "Describe this image.",
                        manifest=options.manifest, template=options.template, image_root=options.image_root)
    raise_for_problems(collected, offers_skip_bad=False)
    if options.fail_if_less_accurate is not None and all(r.truth is None for r in collected.requests):
        from vlmfast.errors import UsageError  # said now, not after every scenario ran and wrote its report

        raise UsageError(f"--fail-if-less-accurate needs ground truth, and {options.manifest} has none in any record",
                         hint='give each record its answer as "solution" (vlmfast score --help names the fields '
                              'read), or drop --fail-if-less-accurate')
    return collected.requests, collected.image_sizes
