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
:mod:`vlmfast.run.bench_figures`' arithmetic on the recorded runs.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field

from vlmfast.run.bench_figures import (
    AS_SAVED, BASE, CKPT, SCHEMA, RunStats, agreement, apply_gates, fidelity_pairs, first_difference,
    noise_notes, scenario_name, scenario_summary, speed_ratios,
)
from vlmfast.declared import FAST, GATES, GEN, INPUT, MODEL, like, nested, option
from vlmfast.engines.bandwidth import run_bandwidth
from vlmfast.engines.contract import Backend
from vlmfast.engines.hf import DECODERS
from vlmfast.engines.open import ENGINES
from vlmfast.engines.rows import GenerationSettings, SampleResult, row_key
from vlmfast.errors import UsageError, check_choice
from vlmfast.inputs.requests import TEMPLATES
from vlmfast.evaluation.scoring import BBOX_SPACES, SCORERS
from vlmfast.run.options import InferOptions
from vlmfast.timing import free_memory, now, peak_memory_mib, reset_peak_memory


@dataclass
class BenchOptions:
    """What ``vlmfast bench`` runs, checked once here (a UsageError with a hint) before anything loads.
    ``batch_sizes`` and ``engines`` may also be given as comma-separated text ("1,8", "hf,vllm").
    ``bbox_space`` None: each row's own, else ``resized`` (see :func:`vlmfast.evaluation.scoring.row_bbox_space`).
    The gates (exit codes 3, 4, 5) are evaluated by :func:`run_bench` into ``report["gates"]``."""

    ckpt: str = like(InferOptions, "ckpt")
    compare_base: str | None = option(None, help="Base model (dir or hub id) run on the same workload.", panel=MODEL)
    images: list[str] | None = like(InferOptions, "images")
    manifest: str | None = like(InferOptions, "manifest")
    synthetic: int | None = option(None, help="Generate N synthetic images as the workload.", panel=INPUT)
    synthetic_size: int = option(224, help="Side of synthetic images in pixels.", panel=INPUT)
    prompt: str | None = like(InferOptions, "prompt")
    template: str = like(InferOptions, "template")
    max_pixels: int | None = like(InferOptions, "max_pixels")
    min_pixels: int | None = like(InferOptions, "min_pixels")
    generation: GenerationSettings = nested(lambda: GenerationSettings(max_new_tokens=128))
    batch_sizes: tuple[int, ...] | str = option("8", help="Comma-separated batch sizes for ckpt (and base), e.g. 1,8.",
                                                panel=GEN, type=str)
    warmup: int = option(1, help="Untimed runs per scenario.", panel=GEN)
    repeats: int = option(3, help="Timed runs per scenario (medians reported).", panel=GEN)
    decoder: str = like(InferOptions, "decoder")
    cuda_graphs: bool | None = like(InferOptions, "cuda_graphs")
    # ckpt and base: torch.compile the decode step (the warm-up runs compile)
    compile: bool = option(False, help="ckpt and base: torch.compile the decode step (compiled in the warm-up runs).",
                           panel=FAST, flag="--compile/--no-compile")
    engines: tuple[str, ...] | str = option(
        "hf", help="Engines for ckpt, comma-separated: hf, vllm (hf,vllm: side by side, with token agreement).",
        panel=MODEL, type=str)
    as_saved: bool = option(True, help="Also run plain HF generate with the saved config (slow when the cache is off).",
                            panel=GEN)
    device: str | None = like(InferOptions, "device")
    dtype: str | None = like(InferOptions, "dtype")
    attn: str | None = like(InferOptions, "attn")
    scorer: str = like(InferOptions, "scorer")
    iou: float = like(InferOptions, "iou")
    bbox_space: str | None = like(InferOptions, "bbox_space")
    fail_if_slower: float | None = option(None, help="Exit 3 when ckpt tokens/s < base tokens/s ÷ X.", panel=GATES)
    fail_on_cache_off: bool = option(False, help="Exit 4 when the saved config turns the cache off anywhere.",
                                     panel=GATES)
    fail_if_less_accurate: float | None = option(
        None, help="Exit 5 when ckpt accuracy < base accuracy − X (needs ground truth in --manifest).", panel=GATES)

    def __post_init__(self):
        self.batch_sizes = _batch_sizes(self.batch_sizes)
        self.engines = _engines(self.engines)
        if self.synthetic is not None and self.synthetic < 1:
            raise UsageError(f"--synthetic {self.synthetic}: expected at least 1 image", hint="e.g. --synthetic 8")
        if not (self.images or self.manifest or self.synthetic):
            raise UsageError("no workload", hint="give --images, --manifest or --synthetic N")
        if self.warmup < 0 or self.repeats < 1:
            raise UsageError(f"--warmup {self.warmup} --repeats {self.repeats}: need 0 or more warm-up runs and 1 or "
                             "more timed runs", hint="e.g. --warmup 1 --repeats 3")
        if self.compile and self.warmup < 1:
            raise UsageError("--compile needs a warm-up run to compile outside the clock", hint="use --warmup 1 or more")
        choices = [("--decoder", self.decoder, DECODERS), ("--scorer", self.scorer, SCORERS),
                   ("--template", self.template, tuple(TEMPLATES))]
        for option, value, known in choices + ([("--bbox-space", self.bbox_space, BBOX_SPACES)] if self.bbox_space is not None else []):
            check_choice(option, value, known)
        self._check_gates()

    def _check_gates(self) -> None:
        if (self.fail_if_slower is not None or self.fail_if_less_accurate is not None) and not self.compare_base:
            raise UsageError("--fail-if-slower and --fail-if-less-accurate compare with the base", hint="add --compare-base BASE")
        if self.fail_if_slower is not None and self.fail_if_slower < 1:
            raise UsageError(f"--fail-if-slower {self.fail_if_slower}: below 1 it would demand ckpt beat the base",
                             hint="X ≥ 1: exit 3 when ckpt tokens/s < base tokens/s ÷ X; 1 means no slower than the base")
        if self.fail_if_less_accurate is not None and not 0 <= self.fail_if_less_accurate <= 1:
            raise UsageError(f"--fail-if-less-accurate {self.fail_if_less_accurate}: an accuracy drop is between 0 and 1",
                             hint="e.g. --fail-if-less-accurate 0.02 (two points)")
        if self.fail_if_less_accurate is not None and not self.manifest:
            raise UsageError("--fail-if-less-accurate needs ground truth", hint="give --manifest with a solution/answer per record")


def _batch_sizes(value) -> tuple[int, ...]:
    items = [x.strip() for x in value.split(",") if x.strip()] if isinstance(value, str) else list(value)
    sizes = [int(x) for x in items if (isinstance(x, str) and x.isdigit()) or (isinstance(x, int) and not isinstance(x, bool))]
    if not items or len(sizes) != len(items) or min(sizes) < 1:
        raise UsageError(f"--batch-sizes {value!r}: expected positive integers", hint="e.g. --batch-sizes 1,8")
    return tuple(dict.fromkeys(sizes))  # a size twice would run and key the same scenario twice


def _engines(value) -> tuple[str, ...]:
    names = [e.strip() for e in value.split(",") if e.strip()] if isinstance(value, str) else list(value)
    if not names or any(e not in ENGINES for e in names):
        raise UsageError(f"--engines {value!r}: expected engines among {', '.join(ENGINES)}, comma-separated",
                         hint="e.g. --engines hf,vllm")
    return tuple(dict.fromkeys(names))


def run_workload(backend: Backend, requests, image_sizes, batch_size: int) -> RunStats:
    """The whole workload once through any engine's :class:`~vlmfast.engines.contract.Backend`, as the
    runner drives it. ``batch_size`` counts answers (with n answers per request, batch_size // n requests
    a batch), as in ``infer``."""
    start = now(backend.device)
    timings, results = [], []
    for parts in backend.batches(requests, image_sizes, backend.plan(requests, image_sizes, batch_size)):
        for _, batch_results, t in parts:
            results.extend(batch_results)
            timings += [t] if t is not None else []  # None: every request of the batch failed (error rows)
    return RunStats(now(backend.device) - start, timings, results)


def score_results(results: list[SampleResult], truths: dict, options: BenchOptions) -> list[dict]:
    """Rows with their scoring fields (see :mod:`vlmfast.evaluation.scoring`)."""
    from vlmfast.evaluation.scoring import rescore

    return rescore([r.record() for r in results], truths, default_scorer=options.scorer, iou=options.iou,
                   bbox_space=options.bbox_space)


class _Noop:
    def start(self, total):
        pass

    def advance(self, samples, tokens):
        pass


def run_bench(options: BenchOptions, progress=None, say=lambda text: None) -> dict:
    """Run every scenario and return the report dict (the ``--json`` schema), its CI gates evaluated:
    ``report["gates"]["exit_code"]`` is what the command exits with."""
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
        o = self.options
        self.say(f"{name} (batch {batch_size}): {o.warmup} warm-up + {o.repeats} timed runs")
        for _ in range(o.warmup):
            run_workload(backend, self.requests, self.sizes, batch_size)
        device = loaded.runtime.device if loaded is not None else "cpu"
        reset_peak_memory(device)
        runs = []
        for _ in range(o.repeats):
            runs.append(run_workload(backend, self.requests, self.sizes, batch_size))
            self.progress.advance(1, runs[-1].new_tokens)
        self.rows[(name, batch_size)] = runs[-1].results
        summary = scenario_summary(name, batch_size, runs, tokenizer, peak_memory_mib(device))
        ok = [r for r in runs[-1].results if r.error is None]
        if loaded is not None:
            context = sum(r.n_prompt_tokens + r.n_new_tokens / 2 for r in ok) / len(ok) if ok else 0
            summary.update(run_bandwidth(loaded, min(batch_size, len(ok) or 1), context, summary["decode_ms_per_token"]))
        else:  # vLLM's model lives in its own process: no weights here to count bytes from
            summary.update(decode_gb_per_s=None, peak_gb_per_s=None, bandwidth_pct_of_peak=None)
        summary.update(_accuracy(score_results(runs[-1].results, self.truths, o)))
        facts = backend.facts()
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
    base_found = locate(options.compare_base, hub=True) if options.compare_base else None
    requests, sizes = _workload(options, scratch)
    bench = _Bench(options, requests, sizes, progress, say, truths={r.id: (r.truth, r.scorer) for r in requests})
    compile_cache = prepare_cache(options.decoder, True) if options.compile else None  # before the model loads
    n_engines = len(options.engines) + bool(options.compare_base)
    progress.start(options.repeats * (len(options.batch_sizes) * n_engines + options.as_saved))
    cache = _checkpoint_scenarios(bench, found, compile_cache)
    for engine in (e for e in options.engines if e != "hf"):
        _opened_scenarios(bench, engine, found)
    base_cache = _engine_scenarios(bench, BASE, base_found, compile_cache) if base_found is not None else None
    return _report(options, requests, bench.scenarios, bench.rows, bench.truths, cache, base_cache, bench.notes,
                   versions())


def _engine_kwargs(options: BenchOptions, compile_cache) -> tuple[dict, dict]:
    """The keywords of the as-saved reference and of vlmfast's engine: per-step clocks on for both."""
    common = dict(min_pixels=options.min_pixels, max_pixels=options.max_pixels, record_steps=True)
    fast = dict(common, decoder=options.decoder, cuda_graphs=options.cuda_graphs, compile=options.compile,
                compile_cache=compile_cache)
    return common, fast


def _checkpoint_scenarios(bench: _Bench, found, compile_cache) -> dict:
    """The checkpoint on vlmfast's engine at each batch size (``--engines`` with hf), and plain generate
    as saved at batch 1 (``--as-saved``). Returns the checkpoint's cache report; the model is freed."""
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
    if "hf" in o.engines:
        for bs in o.batch_sizes:
            bench.measure(CKPT, HfBackend.around(Engine(loaded, o.generation, **fast)), bs, tokenizer, loaded)
    if o.as_saved:
        reference = AsSavedEngine(loaded, o.generation, saved_generation_config(loaded), **common)
        bench.measure(AS_SAVED, HfBackend.around(reference), 1, tokenizer, loaded)
    del loaded
    free_memory()
    return cache


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
                    compile=o.compile, min_pixels=o.min_pixels, max_pixels=o.max_pixels, template=o.template)
    refused = ENGINES[engine].refuses
    return InferOptions(ckpt=o.ckpt, engine=engine, generation=o.generation,
                        **{k: v for k, v in settings.items() if k not in refused})


def _accuracy(scored: list[dict]) -> dict:
    from vlmfast.evaluation.stats import summarize

    s = summarize(scored)
    return {"accuracy": s["accuracy"], "format_rate": s["format_rate"], "scored": s["scored"]}


def _report(options, requests, scenarios, rows, truths, cache, base_cache, notes, versions_) -> dict:
    from vlmfast.evaluation.stats import paired_comparison

    settings = options.generation
    by = {(s["name"], s["batch_size"]): s for s in scenarios}
    accuracy = {}
    for bs in options.batch_sizes:
        if (BASE, bs) in by and by.get((CKPT, bs), {}).get("scored"):
            scores = {name: {row_key(r["id"], r.get("sample")): r["score"] for r in score_results(rows[(name, bs)], truths, options)}
                      for name in (CKPT, BASE)}
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
                     "repeats": options.repeats, "with_ground_truth": sum(t[0] is not None for t in truths.values())},
        "cache": cache,
        "base_cache": base_cache,
        "scenarios": scenarios,
        "ratios": speed_ratios(by, options.batch_sizes, options.engines),
        "accuracy": accuracy,
        "fidelity": fidelity,
        "first_difference": {k: v for k, v in differences.items() if v is not None},
        "notes": notes + noise_notes(scenarios),
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
                        manifest=options.manifest, template=options.template)
    raise_for_problems(collected)
    return collected.requests, collected.image_sizes
