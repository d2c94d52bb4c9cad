"""The arithmetic of a ``vlmfast bench`` report, on recorded runs: per-scenario figures, speed-up ratios,
token agreement, run-to-run noise and the CI gates. Pure functions (no model, no clock), so every
figure can be checked on hand-made runs; :mod:`vlmfast.run.bench` runs the scenarios and calls them."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING

from vlmfast.errors import EXIT_BAD_INPUT, EXIT_CACHE_OFF, EXIT_LESS_ACCURATE, EXIT_SLOWER_THAN_BASE
from vlmfast.evaluation.scoring import reasoning_ends
from vlmfast.timing import percentile, rounded, spread, summarize_timings

if TYPE_CHECKING:
    from vlmfast.engines.hf.engine import BatchTiming, SampleResult

SCHEMA = "vlmfast.bench/3"
CKPT, VLLM, AS_SAVED, BASE = "ckpt", "ckpt-vllm", "ckpt-as-saved", "base"


def scenario_name(engine: str) -> str:
    """The checkpoint's scenario on ``engine``: ``ckpt`` on vlmfast's own, ``ckpt-<engine>`` on another."""
    return CKPT if engine == "hf" else f"ckpt-{engine}"


def _other_engines(engines) -> list[str]:
    return [e for e in engines if e != "hf"]
# Timed runs of one workload whose wall times vary by more than this (coefficient of variation) were
# disturbed by something besides the model — other processes, clock boost or throttling, a cold cache:
# the medians are less trustworthy, and a ratio between scenarios within a few percent of 1 is noise.
NOISY_CV_PCT = 10.0


@dataclass
class RunStats:
    """One timed run of the whole workload in one scenario."""

    wall_s: float
    timings: list[BatchTiming]
    results: list[SampleResult]
    compile_s: float = 0.0  # decode shapes compiled or captured during the run (kept out of its rates, as infer does)

    @property
    def new_tokens(self) -> int:
        """Answer tokens the run delivered, a greedy ``--n`` answer's copies included: every scenario delivers the
        same answers, so their rates compare (plain generate and vLLM decode a greedy answer once, vlmfast's loop
        K times; counting only what was decoded would put that K into every ratio between them)."""
        return sum(r.n_new_tokens for r in self.results if r.error is None)

    @property
    def generate_s(self) -> float:
        """The run's wall time less what compiling and capturing took in it (``generate_s`` in ``infer``)."""
        return max(0.0, self.wall_s - self.compile_s)


def scenario_summary(name: str, batch_size: int, runs: list[RunStats], tokenizer=None, peak=None) -> dict:
    """Figures for one scenario from its recorded runs. Think/answer token counts need ``tokenizer``
    (see :func:`span_tokens`); without one they are null."""
    tps = [r.new_tokens / r.generate_s for r in runs if r.generate_s > 0]
    sps = [sum(x.error is None for x in r.results) / r.generate_s for r in runs if r.generate_s > 0]
    per_run = [summarize_timings(r.timings) for r in runs]
    per_token = [p["decode_ms_per_token"] for p in per_run if p["decode_ms_per_token"] is not None]
    every = summarize_timings([t for r in runs for t in r.timings])  # TTFT over every sample of every run
    last = [r for r in runs[-1].results if r.error is None] if runs else []  # error rows are not samples
    spans = [span_tokens(r.token_ids, tokenizer) for r in last] if tokenizer is not None else []
    thinks, answers = [t for t, _ in spans if t is not None], [a for _, a in spans if a is not None]
    wall_min, wall_max, wall_cv = spread([r.wall_s for r in runs])
    n = len(last) or 1
    return {
        "name": name,
        "batch_size": batch_size,
        "runs": len(runs),
        "wall_s_median": rounded(statistics.median([r.wall_s for r in runs])) if runs else None,
        "wall_s_min": rounded(wall_min),
        "wall_s_max": rounded(wall_max),
        "wall_cv_pct": rounded(wall_cv, 1),
        "compile_s": rounded(sum(r.compile_s for r in runs)),  # in the timed runs, out of tokens_per_s
        "ttft_ms_p50": every["ttft_ms_p50"],
        "ttft_ms_p90": every["ttft_ms_p90"],
        "decode_ms_per_token": rounded(statistics.median(per_token)) if per_token else None,
        "tokens_per_s": rounded(statistics.median(tps)) if tps else None,
        "tokens_per_s_p90": rounded(percentile(tps, 90)),
        "samples_per_s": rounded(statistics.median(sps), 4) if sps else None,
        "mean_new_tokens": rounded(sum(r.n_new_tokens for r in last) / n),
        # over every sample (one without a think counts 0), as mean_new_tokens: the three add up, never exceed
        "mean_think_tokens": rounded(sum(thinks) / n) if thinks else None,
        "mean_answer_tokens": rounded(sum(answers) / n) if answers else None,
        "no_answer_rate": rounded(sum(r.answer is None for r in last) / n, 4),
        "truncation_rate": rounded(sum(r.finish_reason == "length" for r in last) / n, 4),
        **ttft_parts(t for r in runs for t in r.timings),
        "peak_mem_mib": rounded(peak[0], 1) if peak else None,
        "peak_mem_kind": peak[1] if peak else None,
        "step_ms": step_series(runs),
    }


def ttft_parts(timings) -> dict:
    """Where a batch's time to the first token goes, medians over batches (ms): the vision tower, the rest
    of the prefill (the prompt through the language model, the first token), and the copy of the prompts'
    caches into the decode rows that follows it (None where a batch did not say: ``--decoder hf``)."""
    batches = [t for t in timings if t.size]
    vision = [t.vision_s * 1000 for t in batches if t.vision_s is not None]
    fill = [t.cache_fill_s * 1000 for t in batches if getattr(t, "cache_fill_s", None) is not None]
    median = lambda xs: rounded(statistics.median(xs)) if xs else None  # noqa: E731
    return {"ttft_vision_ms_p50": median(vision),
            "ttft_language_ms_p50": median([(t.ttft_s - t.vision_s) * 1000 for t in batches if t.vision_s is not None]),
            "cache_fill_ms_p50": median(fill)}


def span_tokens(token_ids: list[int], tokenizer) -> tuple[int | None, int | None]:
    """(think, answer) token counts of one sample, counted in its generated ids, never re-tokenized.

    The think span is the fewest leading tokens whose decoded text reaches past ``</think>`` (every
    token when the think is unclosed); the answer span the tokens after it up to past ``</answer>``.
    Tags count with their span. Both are slices of the same ids, so think + answer ≤ new tokens (text
    re-encoded on its own can come out longer than what was generated). None: the part is absent."""
    def decode(k: int) -> str:
        return tokenizer.decode(token_ids[:k], skip_special_tokens=True)

    think_end, answer_end = reasoning_ends(decode(len(token_ids)))
    think = _tokens_reaching(think_end, decode, len(token_ids)) if think_end is not None else None
    if answer_end is None:
        return think, None
    return think, _tokens_reaching(answer_end, decode, len(token_ids)) - (think or 0)


def _tokens_reaching(chars: int, decode, n: int) -> int:
    """The fewest leading tokens (of ``n``) whose text is at least ``chars`` long: a binary search,
    since a longer prefix never decodes shorter."""
    lo, hi = 0, n
    while lo < hi:
        mid = (lo + hi) // 2
        if len(decode(mid)) >= chars:
            hi = mid
        else:
            lo = mid + 1
    return lo


def step_series(runs: list[RunStats]) -> list[float]:
    """Median latency of decode step k over every batch of every run: the per-step plot's line."""
    by_step: dict[int, list[float]] = {}
    for run in runs:
        for timing in run.timings:
            for k, s in enumerate(timing.step_times_s):
                by_step.setdefault(k, []).append(s * 1000)
    return [rounded(statistics.median(by_step[k])) for k in sorted(by_step)]


def noise_notes(scenarios: list[dict]) -> list[str]:
    """A note for every scenario whose timed runs vary by more than :data:`NOISY_CV_PCT`."""
    return [f"{s['name']} (batch {s['batch_size']}): its {s['runs']} timed runs vary by {s['wall_cv_pct']:.1f} % "
            f"(wall time {s['wall_s_min']}–{s['wall_s_max']} s; coefficient of variation over {NOISY_CV_PCT:.0f} %): "
            "something else ran or the clocks changed; rerun on a quiet machine or with more --repeats"
            for s in scenarios if s.get("wall_cv_pct") is not None and s["wall_cv_pct"] > NOISY_CV_PCT]


def warmup_notes(warmup: int, scenarios: list[dict]) -> list[str]:
    """Without a warm-up, a scenario's first timed run carries one-off costs (the allocator, kernel and
    algorithm choice, lazy imports), the first scenario's most: said when scenarios are compared."""
    if warmup or len(scenarios) < 2:
        return []
    return ["--warmup 0: each scenario's first timed run carries one-off costs (memory, kernel choice), the first "
            "scenario's most, so the ratios between scenarios lean against it; use --warmup 1 (the default) for "
            "figures to compare or gate on"]


def agreement(a: list[SampleResult], b: list[SampleResult]) -> float | None:
    """Share of answers (matched by id, and sample with --n) whose generated token ids are identical."""
    other = {r.key: r.token_ids for r in b}
    shared = [r for r in a if r.key in other]
    return None if not shared else sum(r.token_ids == other[r.key] for r in shared) / len(shared)


def first_difference(a: list[SampleResult], b: list[SampleResult]) -> dict | None:
    """The first sample (in ``a``'s order) whose tokens differ: its id, where, and both texts."""
    other = {r.key: r for r in b}
    for r in a:
        if r.key in other and r.token_ids != other[r.key].token_ids:
            theirs = other[r.key]
            at = next((i for i, (x, y) in enumerate(zip(r.token_ids, theirs.token_ids)) if x != y),
                      min(len(r.token_ids), len(theirs.token_ids)))
            return {"id": r.id, "sample": r.sample, "token_index": at, "a": r.text, "b": theirs.text}
    return None


def ratio(numerator, denominator):
    return None if not numerator or not denominator else rounded(numerator / denominator)


def speed_ratios(by: dict[tuple[str, int], dict], batch_sizes, engines=("hf", "vllm")) -> dict:
    """Speed-up factors between scenarios (``by``: (name, batch size) → figures). ``x_vs_y@B``: both
    at batch B. The as-saved run is one sample at a time whatever ``batch_sizes`` says, so its label
    names both sides' sizes: ``ckpt@B_vs_as_saved@1``."""
    ratios = {}
    for bs in batch_sizes:
        ck = by.get((CKPT, bs))
        if ck is None:
            continue
        if (BASE, bs) in by:
            ratios[f"ckpt_vs_base@{bs}"] = {"tokens_per_s": ratio(ck["tokens_per_s"], by[(BASE, bs)]["tokens_per_s"])}
        if (AS_SAVED, 1) in by:
            ratios[f"ckpt@{bs}_vs_as_saved@1"] = {
                "tokens_per_s": ratio(ck["tokens_per_s"], by[(AS_SAVED, 1)]["tokens_per_s"]),
                "wall_s": ratio(by[(AS_SAVED, 1)]["wall_s_median"], ck["wall_s_median"]),
            }
        for engine in _other_engines(engines):
            if (scenario_name(engine), bs) in by:
                other = by[(scenario_name(engine), bs)]
                ratios[f"{engine}_vs_ckpt@{bs}"] = {"tokens_per_s": ratio(other["tokens_per_s"], ck["tokens_per_s"])}
    return ratios


def fidelity_pairs(batch_sizes, engines=("hf", "vllm")) -> list[tuple[str, tuple[str, int], tuple[str, int]]]:
    """The (label, scenario a, scenario b) pairs whose greedy tokens should agree."""
    small, large = min(batch_sizes), max(batch_sizes)
    pairs = [("batch_1_vs_n", (CKPT, 1), (CKPT, large)) if small == 1 and large > 1 else None,
             (f"ckpt@{small}_vs_as_saved@1", (CKPT, small), (AS_SAVED, 1)),
             *((f"hf_vs_{e}", (CKPT, small), (scenario_name(e), small)) for e in _other_engines(engines))]
    return [p for p in pairs if p is not None]


def gate(report: dict, fail_if_slower: float | None, fail_on_cache_off: bool,
         fail_if_less_accurate: float | None = None) -> tuple[int, list[str]]:
    """Exit code and messages for the CI gates: 3 when ckpt tokens/s < base tokens/s ÷ X (checked
    first), 5 when ckpt accuracy < base accuracy − X, 2 when that needs accuracy and none was scored,
    4 when the saved checkpoint has the cache off anywhere, else 0. Every tripped gate gets its message.
    That a gate comparing with the base has one is :class:`~vlmfast.run.bench_options.BenchOptions`' check."""
    messages, codes = [], []
    pairs = [(s, b) for s in report["scenarios"] if s["name"] == CKPT
             for b in report["scenarios"] if b["name"] == BASE and b["batch_size"] == s["batch_size"]]
    for s, b in pairs if fail_if_slower is not None else ():
        limit = b["tokens_per_s"] / fail_if_slower
        if s["tokens_per_s"] < limit:
            messages.append(f"ckpt at batch {s['batch_size']}: {s['tokens_per_s']:.1f} tokens/s < base "
                            f"{b['tokens_per_s']:.1f} ÷ {fail_if_slower} = {limit:.1f}")
            codes.append(EXIT_SLOWER_THAN_BASE)
    for s, b in pairs if fail_if_less_accurate is not None else ():
        if s.get("accuracy") is None or b.get("accuracy") is None:
            messages.append(f"--fail-if-less-accurate: no ground truth scored at batch {s['batch_size']} (give a --manifest with solution/answer)")
            codes.append(EXIT_BAD_INPUT)
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
