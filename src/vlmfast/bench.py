"""``vlmfast bench``: one workload, several scenarios, side by side — and gates for CI.

Scenarios (stable names, the JSON schema depends on them):

- ``ckpt``          vlmfast on the checkpoint: cache forced on, batched (once per ``--batch-sizes`` entry)
- ``ckpt-as-saved`` plain HF ``generate`` honouring the checkpoint's saved generation config, one
                    sample at a time — what the user got before vlmfast
- ``base``          vlmfast on the base model, same workload and batch sizes (``--compare-base``)

Each scenario: ``warmup`` untimed runs, then ``repeats`` timed runs of the whole workload. Throughput
figures are medians (and p90) over the timed runs; TTFT percentiles are over every sample of every run.
"""

from __future__ import annotations

import copy
import gc
import statistics
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from .capacity import run_bandwidth
from .engine import Engine, GenerationSettings, SampleResult
from .errors import UsageError
from .timing import now, peak_memory_mib, percentile, reset_peak_memory

SCHEMA = "vlmfast.bench/1"
CKPT, AS_SAVED, BASE = "ckpt", "ckpt-as-saved", "base"


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
    compile: bool = False  # ckpt and base: static cache + torch.compile (the warm-up runs compile)


@dataclass
class RunStats:
    """One timed run of the whole workload in one scenario."""

    wall_s: float
    ttft_ms: list[float]  # one per sample
    decode_s: float
    decode_steps: int
    step_ms: list[list[float]]  # per batch: latency of each decode step
    results: list[SampleResult]

    @property
    def new_tokens(self) -> int:
        return sum(r.n_new_tokens for r in self.results)


def run_workload(engine: Engine, requests, image_sizes, batch_size: int) -> RunStats:
    """The whole workload once, with per-step clocks on."""
    start = now(engine.loaded.model.device)
    ttft, step_ms, results = [], [], []
    decode_s, steps = 0.0, 0
    for _, batch_results, t in engine.run(requests, image_sizes, batch_size):
        results.extend(batch_results)
        if t is None:  # every request of the batch failed (error rows)
            continue
        ttft.extend([t.ttft_s * 1000] * t.size)
        decode_s += t.decode_s
        steps += max(t.steps - 1, 0)
        step_ms.append([s * 1000 for s in t.step_times_s])
    return RunStats(now(engine.loaded.model.device) - start, ttft, decode_s, steps, step_ms, results)


class AsSavedEngine(Engine):
    """Plain ``generate`` with the checkpoint's generation config exactly as saved (cache off if it
    says so): the same inputs and stop settings as vlmfast, but no ``use_cache`` argument."""

    def __init__(self, loaded, settings, saved_generation_config, **kwargs):
        self.saved_generation_config = saved_generation_config
        super().__init__(loaded, settings, **kwargs)

    def _generate_kwargs(self) -> dict:
        kwargs = super()._generate_kwargs()
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

    from .checkpoint import Resolved, read_configs

    # an adapter dir has no config of its own: what plain generate honours is its base's
    source = loaded.base_source or loaded.source
    config, generation = read_configs(Resolved(source, Path(source).is_dir()))
    if generation is not None:
        return GenerationConfig.from_dict(copy.deepcopy(generation))
    return GenerationConfig.from_model_config(loaded.model.config)


def scenario_summary(name: str, batch_size: int, runs: list[RunStats], tokenizer=None, peak=None) -> dict:
    """Figures for one scenario from its recorded runs. Pure apart from counting think tokens."""
    tps = [r.new_tokens / r.wall_s for r in runs if r.wall_s > 0]
    sps = [sum(x.error is None for x in r.results) / r.wall_s for r in runs if r.wall_s > 0]
    per_token = [r.decode_s * 1000 / r.decode_steps for r in runs if r.decode_steps]
    ttft = [t for r in runs for t in r.ttft_ms]
    last = [r for r in runs[-1].results if r.error is None] if runs else []  # error rows are not samples
    thinks = [r.think for r in last if r.think is not None]
    think_len = [len(tokenizer.encode(t, add_special_tokens=False)) if tokenizer else len(t.split()) for t in thinks]
    n = len(last) or 1
    return {
        "name": name,
        "batch_size": batch_size,
        "runs": len(runs),
        "wall_s_median": _r(statistics.median([r.wall_s for r in runs])) if runs else None,
        "ttft_ms_p50": _r(percentile(ttft, 50)),
        "ttft_ms_p90": _r(percentile(ttft, 90)),
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
        for batch in run.step_ms:
            for k, ms in enumerate(batch):
                by_step.setdefault(k, []).append(ms)
    return [_r(statistics.median(by_step[k])) for k in sorted(by_step)]


def agreement(a: list[SampleResult], b: list[SampleResult]) -> float | None:
    """Share of samples (matched by id) whose generated token ids are identical."""
    other = {r.id: r.token_ids for r in b}
    shared = [r for r in a if r.id in other]
    return None if not shared else sum(r.token_ids == other[r.id] for r in shared) / len(shared)


def ratio(numerator, denominator):
    return None if not numerator or not denominator else _r(numerator / denominator)


def gate(report: dict, fail_if_slower: float | None, fail_on_cache_off: bool) -> tuple[int, list[str]]:
    """Exit code and messages for the CI gates: 3 when ckpt tokens/s < base tokens/s ÷ X (checked
    first), 4 when the saved checkpoint has the cache off anywhere, else 0."""
    from .errors import EXIT_CACHE_OFF, EXIT_SLOWER_THAN_BASE

    messages = []
    code = 0
    if fail_if_slower is not None:
        pairs = [(s, b) for s in report["scenarios"] if s["name"] == CKPT
                 for b in report["scenarios"] if b["name"] == BASE and b["batch_size"] == s["batch_size"]]
        if not pairs:
            messages.append("--fail-if-slower needs --compare-base: no base figures to compare with")
            code = code or 2
        for s, b in pairs:
            limit = b["tokens_per_s"] / fail_if_slower
            if s["tokens_per_s"] < limit:
                messages.append(f"ckpt at batch {s['batch_size']}: {s['tokens_per_s']:.1f} tokens/s < base "
                                f"{b['tokens_per_s']:.1f} ÷ {fail_if_slower} = {limit:.1f}")
                code = code or EXIT_SLOWER_THAN_BASE
    if fail_on_cache_off and report["cache"]["found_off"]:
        messages.append("the checkpoint's saved config turns the KV cache off in: " + ", ".join(report["cache"]["found_off"]))
        code = code or EXIT_CACHE_OFF
    return code, messages


def apply_gates(report: dict, fail_if_slower: float | None, fail_on_cache_off: bool) -> int:
    """Evaluate the CI gates, record them in ``report["gates"]`` and return the exit code."""
    code, messages = gate(report, fail_if_slower, fail_on_cache_off)
    report["gates"] = {"fail_if_slower": fail_if_slower, "fail_on_cache_off": fail_on_cache_off,
                       "exit_code": code, "messages": messages}
    return code


def _r(value, digits=3):
    return None if value is None else round(value, digits)


class _Noop:
    def start(self, total):  # noqa: D401 - progress protocol
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
    from .runner import versions

    requests, sizes = _workload(options, scratch)
    settings = options.generation
    engine_kwargs = dict(min_pixels=options.min_pixels, max_pixels=options.max_pixels, record_steps=True)
    fast = dict(engine_kwargs, compile=options.compile)
    if options.compile and options.warmup < 1:
        raise UsageError("--compile needs a warm-up run to compile outside the clock", hint="use --warmup 1 or more")
    scenarios: list[dict] = []
    tokens: dict[tuple[str, int], list[SampleResult]] = {}

    def measure(name, engine, batch_size):
        say(f"{name} (batch {batch_size}): {options.warmup} warm-up + {options.repeats} timed runs")
        for _ in range(options.warmup):
            run_workload(engine, requests, sizes, batch_size)
        reset_peak_memory(engine.loaded.runtime.device)
        runs = []
        for _ in range(options.repeats):
            runs.append(run_workload(engine, requests, sizes, batch_size))
            progress.advance(1, runs[-1].new_tokens)
        tokens[(name, batch_size)] = runs[-1].results
        peak = peak_memory_mib(engine.loaded.runtime.device)
        summary = scenario_summary(name, batch_size, runs, engine.loaded.processor.tokenizer, peak)
        ok = [r for r in runs[-1].results if r.error is None]
        context = sum(r.n_prompt_tokens + r.n_new_tokens / 2 for r in ok) / len(ok) if ok else 0
        summary.update(run_bandwidth(engine.loaded, min(batch_size, len(ok) or 1), context,
                                     summary["decode_ms_per_token"]))
        scenarios.append(summary)

    total = options.repeats * (len(options.batch_sizes) * (2 if options.compare_base else 1) + options.as_saved)
    progress.start(total)
    loaded = load(options.ckpt, device=options.device, dtype=options.dtype, attn=options.attn)
    cache = loaded.cache.as_dict()
    notes = list(loaded.notes)
    for bs in options.batch_sizes:
        measure(CKPT, Engine(loaded, settings, **fast), bs)
    if options.as_saved:
        measure(AS_SAVED, AsSavedEngine(loaded, settings, saved_generation_config(loaded), **engine_kwargs), 1)
    del loaded
    _free_memory()
    base_cache = None
    if options.compare_base:
        base = load(options.compare_base, device=options.device, dtype=options.dtype, attn=options.attn)
        base_cache = base.cache.as_dict()
        for bs in options.batch_sizes:
            measure(BASE, Engine(base, settings, **fast), bs)
        del base
        _free_memory()

    by = {(s["name"], s["batch_size"]): s for s in scenarios}
    ratios = {}
    for bs in options.batch_sizes:
        ck = by[(CKPT, bs)]
        if (BASE, bs) in by:
            ratios[f"ckpt_vs_base@{bs}"] = {"tokens_per_s": ratio(ck["tokens_per_s"], by[(BASE, bs)]["tokens_per_s"])}
        if (AS_SAVED, 1) in by:
            ratios[f"ckpt_vs_as_saved@{bs}"] = {
                "tokens_per_s": ratio(ck["tokens_per_s"], by[(AS_SAVED, 1)]["tokens_per_s"]),
                "wall_s": ratio(by[(AS_SAVED, 1)]["wall_s_median"], ck["wall_s_median"]),
            }
    fidelity = {}
    small, large = min(options.batch_sizes), max(options.batch_sizes)
    if small == 1 and large > 1 and settings.greedy:
        fidelity["batch_1_vs_n"] = agreement(tokens[(CKPT, 1)], tokens[(CKPT, large)])
    if (AS_SAVED, 1) in tokens and settings.greedy:
        fidelity["ckpt_vs_as_saved"] = agreement(tokens[(CKPT, small)], tokens[(AS_SAVED, 1)])
    return {
        "schema": SCHEMA,
        "checkpoint": options.ckpt,
        "base": options.compare_base,
        "workload": {"samples": len(requests), "max_new_tokens": settings.max_new_tokens, "ignore_eos": settings.ignore_eos,
                     "compile": options.compile,
                     "greedy": settings.greedy, "batch_sizes": list(options.batch_sizes), "warmup": options.warmup,
                     "repeats": options.repeats},
        "cache": cache,
        "base_cache": base_cache,
        "scenarios": scenarios,
        "ratios": ratios,
        "fidelity": fidelity,
        "notes": notes,
        "versions": versions(),
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

        folder = scratch
        size = options.synthetic_size
        images += [str(p) for p in make_images(folder, n=options.synthetic, sizes=[(size, size)])]
    collected = collect(images=images or None, prompt=options.prompt or "Describe this image.",
                        manifest=options.manifest, template=options.template)
    raise_for_problems(collected)
    return collected.requests, collected.image_sizes
