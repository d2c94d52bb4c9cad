import json
import struct

import pytest

from conftest import vlmfast
from vlmfast.run.bench import BenchOptions
from vlmfast.run.bench_figures import (
    AS_SAVED, BASE, CKPT, NOISY_CV_PCT, SCHEMA, RunStats, agreement, fidelity_pairs, gate, noise_notes, ratio,
    scenario_summary, span_tokens, speed_ratios, step_series, warmup_notes,
)
from vlmfast.engines.hf.engine import BatchTiming, SampleResult
from vlmfast.engines.rows import GenerationSettings
from vlmfast.errors import UsageError


def _run(wall, ttft_ms, steps_ms, tokens=8, think="a b"):
    """Two samples in one batch (or one each in two batches), 7 decode steps of 10 ms per batch."""
    results = [SampleResult(id=f"s{i}", images=[], prompt="", text="", think=think, answer=None if i else "x",
                            finish_reason="length" if i else "eos", n_new_tokens=tokens, token_ids=[i])
               for i in range(2)]
    timings = [BatchTiming(size=2 // len(steps_ms), preprocess_s=0.0, ttft_s=ttft_ms / 1000, decode_s=0.07, steps=8,
                           new_tokens=tokens, step_times_s=tuple(ms / 1000 for ms in batch)) for batch in steps_ms]
    return RunStats(wall_s=wall, timings=timings, results=results)


def test_scenario_summary_on_recorded_times():
    runs = [_run(2.0, 10.0, [[1.0, 2.0]]), _run(1.0, 20.0, [[3.0, 4.0]]), _run(4.0, 30.0, [[5.0, 6.0], [7.0]])]
    s = scenario_summary(CKPT, 2, runs)
    assert s["tokens_per_s"] == 8.0  # median of 16/2, 16/1, 16/4
    assert s["tokens_per_s_p90"] == pytest.approx(14.4)
    assert s["wall_s_median"] == 2.0
    assert (s["ttft_ms_p50"], s["ttft_ms_p90"]) == (20.0, 30.0)
    assert s["decode_ms_per_token"] == 10.0
    assert (s["no_answer_rate"], s["truncation_rate"], s["mean_new_tokens"]) == (0.5, 0.5, 8.0)
    assert s["mean_think_tokens"] is s["mean_answer_tokens"] is None  # no tokenizer, no token counts
    assert s["step_ms"] == step_series(runs) == [4.0, 4.0]  # step 0: median of 1, 3, 5, 7; step 1: of 2, 4, 6
    # wall 2, 1, 4 s: mean 7/3, sample variance (1/9 + 16/9 + 25/9) / 2 = 7/3, CV = sqrt(7/3) / (7/3)
    assert (s["wall_s_min"], s["wall_s_max"], s["wall_cv_pct"]) == (1.0, 4.0, 65.5)


def test_time_to_the_first_token_split_into_its_parts():
    """Per batch: the vision tower, the rest of the prefill, the cache copy into decode rows (medians, ms)."""
    def timing(ttft, vision, fill):
        return BatchTiming(size=4, preprocess_s=0.0, ttft_s=ttft, decode_s=0.1, steps=8, new_tokens=8,
                           vision_s=vision, cache_fill_s=fill)
    runs = [RunStats(wall_s=1.0, timings=[timing(0.300, 0.180, 0.002), timing(0.320, 0.200, 0.004)], results=[]),
            RunStats(wall_s=1.0, timings=[timing(0.400, 0.250, 0.003), BatchTiming(size=0, preprocess_s=0.0, ttft_s=0.0,
                                                                                   decode_s=1.0, steps=9, new_tokens=0)],
                     results=[])]
    s = scenario_summary(CKPT, 4, runs)
    assert (s["ttft_vision_ms_p50"], s["ttft_language_ms_p50"], s["cache_fill_ms_p50"]) == (200.0, 120.0, 3.0)
    assert s["ttft_vision_ms_p50"] + s["ttft_language_ms_p50"] == 320.0  # the median batch's TTFT
    hf = scenario_summary(CKPT, 2, [_run(1.0, 10.0, [[1.0]])])  # plain generate says nothing of its parts
    assert hf["ttft_vision_ms_p50"] is hf["ttft_language_ms_p50"] is hf["cache_fill_ms_p50"] is None


def test_compared_scenarios_without_a_warm_up_are_said_to_lean():
    two = [{"name": CKPT}, {"name": BASE}]
    assert warmup_notes(1, two) == [] and warmup_notes(0, two[:1]) == []  # a warm-up, or nothing compared
    assert "--warmup 0" in warmup_notes(0, two)[0] and "--warmup 1" in warmup_notes(0, two)[0]


class FakeTokenizer:
    """Pieces by id; 9 is EOS (special). ``encode`` splits into characters: re-encoding a text on its
    own can give more tokens than the model generated, which is how mean think tokens (86) once
    exceeded mean new tokens (64)."""

    PIECES = ["<think>", "a long thought", "</think>", "<answer>", "x", "</answer>", "\n", "</", "think>", ""]

    def decode(self, ids, skip_special_tokens=True):
        return "".join(self.PIECES[i] for i in ids if not (skip_special_tokens and i == 9))

    def encode(self, text, add_special_tokens=False):
        return list(text)


@pytest.mark.parametrize("ids, spans", [
    ([0, 1, 2, 6, 3, 4, 5, 9], (3, 4)),  # think = <think> thought </think>; answer = "\n" <answer> x </answer>
    ([0, 1, 7, 8, 3, 4, 5], (4, 3)),  # "</think>" split over two tokens: both are the think's
    ([1, 2, 3, 4, 5], (2, 3)),  # the template opened <think>
    ([0, 1, 1], (3, None)),  # unclosed think: every token
    ([3, 4, 5, 9], (None, 3)),
    ([4, 4], (None, None)),
])
def test_span_tokens_are_counted_in_the_generated_ids(ids, spans):
    assert span_tokens(ids, FakeTokenizer()) == spans
    assert sum(n or 0 for n in spans) <= len(ids)


def test_think_tokens_never_exceed_new_tokens():
    ids = [0, 1, 2, 3, 4, 5, 9]
    result = SampleResult(id="s", images=[], prompt="", text=FakeTokenizer().decode(ids), think="a long thought",
                          answer="x", finish_reason="eos", n_new_tokens=len(ids), token_ids=ids)
    assert len(FakeTokenizer().encode(result.think)) == 14 > result.n_new_tokens  # the old count: re-encoded text
    s = scenario_summary(CKPT, 1, [RunStats(wall_s=1.0, timings=[], results=[result])], FakeTokenizer())
    assert (s["mean_think_tokens"], s["mean_answer_tokens"], s["mean_new_tokens"]) == (3.0, 3.0, 7.0)


def test_mean_think_tokens_stay_below_mean_new_tokens_when_some_samples_have_no_think():
    """A long unclosed think beside short answers without one: the means are over every sample, so the
    think mean cannot rise above the new-token mean (it showed 128.0 above 123.9)."""
    def row(rid, ids):
        return SampleResult(id=rid, images=[], prompt="", text=FakeTokenizer().decode(ids), think=None, answer=None,
                            finish_reason="length", n_new_tokens=len(ids), token_ids=ids)

    rows = [row("long", [0] + [1] * 9), row("short", [4, 4])]  # an unclosed think of 10; 2 tokens, no tags
    s = scenario_summary(CKPT, 2, [RunStats(wall_s=1.0, timings=[], results=rows)], FakeTokenizer())
    assert (s["mean_think_tokens"], s["mean_new_tokens"]) == (5.0, 6.0)


@pytest.mark.parametrize("walls, cv, noisy", [
    ([1.0, 1.0, 1.3], 15.7, True),  # mean 1.1, variance (0.01 + 0.01 + 0.04) / 2 = 0.03 → 0.1732 / 1.1
    ([2.0, 2.0, 2.1], 2.8, False),  # variance (1 + 1 + 4) / 900 / 2 → 0.0577 / 2.0333
    ([1.0], None, False),  # one run: no spread to speak of
])
def test_run_spread_and_the_noise_note(walls, cv, noisy):
    s = scenario_summary(CKPT, 8, [RunStats(wall_s=w, timings=[], results=[]) for w in walls])
    assert (s["wall_s_min"], s["wall_s_max"], s["wall_cv_pct"]) == (min(walls), max(walls), cv)
    notes = noise_notes([s])
    assert len(notes) == noisy
    if noisy:
        assert notes[0].startswith(f"ckpt (batch 8): its 3 timed runs vary by {cv} %") and "1.0–1.3 s" in notes[0]
        assert f"over {NOISY_CV_PCT:.0f} %" in notes[0]


def test_ratio_labels_name_both_batch_sizes():
    by = {(CKPT, 1): {"tokens_per_s": 10.0, "wall_s_median": 2.0}, (CKPT, 4): {"tokens_per_s": 40.0, "wall_s_median": 0.5},
          (AS_SAVED, 1): {"tokens_per_s": 5.0, "wall_s_median": 4.0}, (BASE, 4): {"tokens_per_s": 20.0}}
    assert speed_ratios(by, (1, 4)) == {
        "ckpt@1_vs_as_saved@1": {"tokens_per_s": 2.0, "wall_s": 2.0},
        "ckpt@4_vs_as_saved@1": {"tokens_per_s": 8.0, "wall_s": 8.0},  # batched ckpt against one at a time
        "ckpt_vs_base@4": {"tokens_per_s": 2.0},  # both at batch 4
    }
    assert [name for name, _, _ in fidelity_pairs((4, 1))] == ["batch_1_vs_n", "ckpt@1_vs_as_saved@1", "hf_vs_vllm"]
    assert fidelity_pairs((4,))[0] == ("ckpt@4_vs_as_saved@1", (CKPT, 4), (AS_SAVED, 1))


@pytest.mark.parametrize("kwargs, message", [
    ({}, "no workload"),
    ({"synthetic": 0}, "--synthetic 0"),
    ({"synthetic": 1, "synthetic_size": 0}, "--synthetic-size 0"),
    ({"synthetic": 1, "iou": -3.0}, "--iou -3.0"),
    ({"synthetic": 1, "batch_sizes": "0,x"}, "positive integers"),
    ({"synthetic": 1, "batch_sizes": (2, 0)}, "positive integers"),
    ({"synthetic": 1, "batch_sizes": ""}, "positive integers"),
    ({"synthetic": 1, "engines": "hf,tgi"}, "--engines"),
    ({"synthetic": 1, "repeats": 0}, "--repeats 0"),
    ({"synthetic": 1, "compile": True, "warmup": 0}, "--compile"),
    ({"synthetic": 1, "decoder": "fast"}, "--decoder fast"),
    ({"synthetic": 1, "bbox_space": "normalized"}, "--bbox-space normalized"),
    ({"synthetic": 1, "fail_if_slower": 2.0}, "compare with the base"),
    ({"synthetic": 1, "fail_if_less_accurate": 0.1}, "compare with the base"),
    ({"synthetic": 1, "compare_base": "b", "fail_if_slower": 0.5}, "--fail-if-slower 0.5"),
    ({"synthetic": 1, "compare_base": "b", "fail_if_slower": float("nan")}, "--fail-if-slower nan"),
    ({"synthetic": 1, "compare_base": "b", "fail_if_slower": float("inf")}, "--fail-if-slower inf"),
    ({"synthetic": 1, "compare_base": "b", "fail_if_less_accurate": 1.5}, "--fail-if-less-accurate 1.5"),
    ({"synthetic": 1, "compare_base": "b", "fail_if_less_accurate": 0.1}, "needs ground truth"),
])
def test_bench_options_check_themselves(kwargs, message):
    with pytest.raises(UsageError) as exc:
        BenchOptions(ckpt="any", **kwargs)
    assert message in exc.value.message and exc.value.hint


def test_bench_options_read_comma_separated_text():
    options = BenchOptions(ckpt="any", synthetic=2, batch_sizes="1, 8,8", engines="hf,vllm", compare_base="b",
                           fail_if_slower=1.0, manifest="m.jsonl", fail_if_less_accurate=0.0)
    assert (options.batch_sizes, options.engines, options.bbox_space) == ((1, 8), ("hf", "vllm"), None)


def test_ratio_agreement_and_gates():
    assert ratio(30.0, 10.0) == 3.0 and ratio(None, 1.0) is None and ratio(1.0, 0) is None
    a = [SampleResult(id="x", images=[], prompt="", token_ids=[1, 2]), SampleResult(id="y", images=[], prompt="", token_ids=[3])]
    b = [SampleResult(id="x", images=[], prompt="", token_ids=[1, 2]), SampleResult(id="y", images=[], prompt="", token_ids=[4])]
    assert agreement(a, b) == 0.5 and agreement(a, []) is None
    report = {"cache": {"found_off": []}, "scenarios": [
        {"name": CKPT, "batch_size": 8, "tokens_per_s": 50.0}, {"name": BASE, "batch_size": 8, "tokens_per_s": 100.0}]}
    assert gate(report, 2.0, True) == (0, [])  # 50 >= 100 / 2
    code, messages = gate(report, 1.5, False)
    assert code == 3 and "50.0 tokens/s < base 100.0" in messages[0]
    off = {**report, "cache": {"found_off": ["generation_config.json: use_cache"]}}
    assert gate(off, None, True)[0] == 4
    assert gate(off, 1.5, True)[0] == 3  # slower is checked first; both messages are given
    assert len(gate(off, 1.5, True)[1]) == 2


def _png_size(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def test_bench_end_to_end_through_the_cli(grpo_ckpt, base_ckpt, tmp_path):
    rep = tmp_path / "rep"
    r = vlmfast("bench", "--ckpt", grpo_ckpt, "--compare-base", base_ckpt, "--synthetic", 3, "--synthetic-size", 56,
                "--batch-sizes", "1,3", "--max-new-tokens", 6, "--ignore-eos", "--repeats", 2, "--report", rep, "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["schema"] == SCHEMA
    assert [(s["name"], s["batch_size"]) for s in report["scenarios"]] == [
        (CKPT, 1), (CKPT, 3), (AS_SAVED, 1), (BASE, 1), (BASE, 3)]
    for s in report["scenarios"]:
        assert s["runs"] == 2 and s["mean_new_tokens"] == 6 and s["truncation_rate"] == 1.0
        assert s["tokens_per_s"] > 0 and len(s["step_ms"]) == 5
        assert s["wall_s_min"] <= s["wall_s_median"] <= s["wall_s_max"] and s["wall_cv_pct"] >= 0
        assert s["mean_think_tokens"] is None or s["mean_think_tokens"] <= s["mean_new_tokens"]
    assert set(report["ratios"]) == {"ckpt_vs_base@1", "ckpt_vs_base@3", "ckpt@1_vs_as_saved@1", "ckpt@3_vs_as_saved@1"}
    assert report["fidelity"] == {"batch_1_vs_n": 1.0, "ckpt@1_vs_as_saved@1": 1.0}
    assert len(report["cache"]["found_off"]) == 3 and report["base_cache"]["found_off"] == []
    assert report["gates"]["exit_code"] == 0
    assert "ckpt-as-saved" in (rep / "report.md").read_text()
    assert json.loads((rep / "report.json").read_text())["scenarios"] == report["scenarios"]
    assert _png_size(rep / "plot.png") == (1320, 495)
    page = (rep / "report.html").read_text()
    assert "ckpt-as-saved" in page and "data:image/png;base64," in page and "http" not in page.split("<pre>")[0]


def test_plot_has_a_line_per_scenario(tmp_path):
    from vlmfast.report.plot import step_lines, write_plot

    report = {"checkpoint": "x", "scenarios": [
        {"name": CKPT, "batch_size": 8, "step_ms": [1.0, 1.0], "tokens_per_s": 10.0},
        {"name": AS_SAVED, "batch_size": 1, "step_ms": [2.0, 3.0], "tokens_per_s": 2.0}]}
    assert step_lines(report) == {"ckpt (batch 8)": [1.0, 1.0], "ckpt-as-saved (batch 1)": [2.0, 3.0]}
    assert _png_size(write_plot(report, tmp_path / "p.png"))[0] > 0


@pytest.mark.parametrize("kind,expected", [("grpo", 4), ("base", 0)])
def test_cache_off_gate_on_both_checkpoint_kinds(request, kind, expected):
    ckpt = request.getfixturevalue(f"{kind}_ckpt")
    r = vlmfast("bench", "--ckpt", ckpt, "--synthetic", 1, "--synthetic-size", 56, "--max-new-tokens", 2,
                "--repeats", 1, "--warmup", 0, "--no-as-saved", "--fail-on-cache-off")
    assert r.returncode == expected, r.stderr


@pytest.mark.process_mechanism  # bench's exit code against its own figures; bench runs under 4.57 end to end above
@pytest.mark.parametrize("kind,factor", [("grpo", 1.0), ("base", 1000.0)])
def test_slower_gate(request, base_ckpt, kind, factor):
    """X=1000 can never trip; X=1 trips exactly when ckpt measured slower than base. Either way the
    exit code must agree with the figures printed, for a GRPO-like and a base-like checkpoint (each
    with one of the two factors: a bench run is ~20 s here)."""
    ckpt = request.getfixturevalue(f"{kind}_ckpt")
    r = vlmfast("bench", "--ckpt", ckpt, "--compare-base", base_ckpt, "--synthetic", 2, "--synthetic-size", 56,
                "--max-new-tokens", 3, "--repeats", 1, "--no-as-saved", "--fail-if-slower", factor, "--json")
    report = json.loads(r.stdout)
    ck, base = (s["tokens_per_s"] for s in report["scenarios"])
    expected = 3 if ck < base / factor else 0
    assert factor < 1000 or expected == 0
    assert r.returncode == expected == report["gates"]["exit_code"]
    assert (r.returncode == 0) == ("gate:" not in r.stderr)


def test_bench_usage_errors(grpo_ckpt):
    r = vlmfast("bench", "--ckpt", grpo_ckpt)
    assert r.returncode == 2 and "no workload" in r.stderr
    r = vlmfast("bench", "--ckpt", grpo_ckpt, "--synthetic", 1, "--fail-if-slower", 2)
    assert r.returncode == 2 and "--compare-base" in r.stderr
    r = vlmfast("bench", "--ckpt", grpo_ckpt, "--synthetic", 1, "--batch-sizes", "0,x")
    assert r.returncode == 2 and "positive integers" in r.stderr


def test_an_accuracy_gate_on_a_manifest_without_ground_truth_is_refused_before_any_run(grpo_ckpt, images, tmp_path):
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(json.dumps({"id": "a", "image": str(images[0]), "prompt": "Count."}) + "\n")
    r = vlmfast("bench", "--ckpt", grpo_ckpt, "--compare-base", grpo_ckpt, "--manifest", manifest,
                "--fail-if-less-accurate", 0.1, "--report", tmp_path / "report", "--json")
    assert r.returncode == 2 and "has none in any record" in json.loads(r.stdout)["error"]["message"], r.stderr
    assert not (tmp_path / "report").exists() and "loading" not in r.stderr  # nothing measured, nothing written


def test_bench_n_answers_per_request_count_as_answers(grpo_ckpt, images):
    """bench --n 2: every request gives two sampled answers; --batch-sizes counts answers, as in infer, and
    the throughput counts every answer's tokens."""
    import json

    from conftest import cli

    r = cli("bench", "--ckpt", grpo_ckpt, "--images", *images[:2], "--max-new-tokens", 4, "--ignore-eos", "--batch-sizes", 4,
            "--warmup", 0, "--repeats", 1, "--no-as-saved", "--n", 2, "--temperature", 1.0, "--seed", 0, "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    (ckpt,) = report["scenarios"]
    assert (report["workload"]["n"], report["workload"]["samples"], report["workload"]["greedy"]) == (2, 2, False)
    # 2 requests × 2 answers × 4 tokens; the wall time is rounded to the millisecond, and a tiny run takes a few
    # dozen of them: allow that rounding (16 tokens stay far from the 8 of counting requests, not answers)
    rounding = ckpt["tokens_per_s"] * 0.0005 + 0.01
    assert ckpt["mean_new_tokens"] == 4.0 and ckpt["tokens_per_s"] * ckpt["wall_s_median"] == pytest.approx(16, abs=rounding)


def test_a_bench_with_ground_truth_shows_accuracy_format_and_ckpt_minus_base(capsys):
    from vlmfast.report.bench_report import render_bench

    scenario = {"name": CKPT, "batch_size": 2, "tokens_per_s": 10.0, "accuracy": 0.75, "format_rate": 0.5}
    report = {"scenarios": [scenario, {**scenario, "name": BASE, "accuracy": 0.5}], "ratios": {}, "fidelity": {},
              "cache": {"found_off": []}, "notes": [],
              "accuracy": {"ckpt_vs_base@2": {"n": 8, "difference": 0.25, "ci_low": -0.125, "ci_high": 0.625, "p_value": 0.5}}}
    render_bench(report)
    err = capsys.readouterr().err
    assert "accuracy" in err and "0.750" in err and "0.500" in err and "format ok" in err
    assert "accuracy ckpt_vs_base@2: +25.0 points (95 % CI -12.5 to +62.5) over 8 samples, McNemar p = 0.5" in err


def test_rates_leave_out_what_compiling_took_inside_a_timed_run():
    """A decode shape built (compiled, captured) during a timed run is not decoding: tokens/s and samples/s
    are each run's over its wall time less its compile_s, as infer's generate_s leaves compile_s out."""
    runs = [RunStats(wall, [], _run(1.0, 10.0, [[1.0]]).results, compile_s=c) for wall, c in ((2.0, 1.0), (3.0, 1.0), (5.0, 1.0))]
    s = scenario_summary(CKPT, 2, runs)
    assert s["tokens_per_s"] == 16 / 2.0  # the median of 16/1, 16/2 and 16/4 — not of 16/2, 16/3 and 16/5
    assert s["samples_per_s"] == 2 / 2.0 and s["compile_s"] == 3.0
    assert s["wall_s_median"] == 3.0  # the wall times stay what they were


def test_shapes_rebuilt_during_a_timed_run_are_counted_in_its_compile_s(loaded, tmp_path):
    """Prompts in four cache-length buckets at batch 1 need four static decode shapes; a CPU keeps three, so
    every run of the workload builds shapes again — after the warm-up too. What those builds took is that
    run's compile_s, out of the time its rates are computed over."""
    from vlmfast.checkpoints.tiny import make_images
    from vlmfast.engines.hf.backend import HfBackend
    from vlmfast.engines.hf.engine import Engine, GenerationSettings
    from vlmfast.inputs.requests import collect
    from vlmfast.run.bench import run_workload

    sides = [224, 448, 672, 896]  # 64 to 1024 image tokens: one 256-position bucket each
    paths = make_images(tmp_path, n=4, sizes=[(s, s) for s in sides])
    work = collect(images=[str(p) for p in paths], prompt="Describe.")
    engine = Engine(loaded, GenerationSettings(max_new_tokens=2, ignore_eos=True), compile=True, compiler=lambda fn: fn)
    builds, timed_build = [], engine.policy.timed

    def counted(build):
        builds.append(engine.policy.compile_s)
        return timed_build(build)

    engine.policy.timed = counted
    backend = HfBackend.around(engine)
    run_workload(backend, work.requests, work.image_sizes, 1)  # the warm-up builds every shape once
    before, compiled = len(builds), engine.policy.compile_s
    timed = run_workload(backend, work.requests, work.image_sizes, 1)
    assert len(builds) - before >= 1  # shapes were built again inside the timed run
    assert timed.compile_s == pytest.approx(engine.policy.compile_s - compiled) and timed.compile_s > 0
    assert timed.generate_s == pytest.approx(timed.wall_s - timed.compile_s)


def test_ckpt_and_base_timed_runs_alternate_on_one_machine_state(grpo_ckpt, base_ckpt, monkeypatch):
    """--compare-base: the base is loaded beside the checkpoint (both fit) and their timed runs alternate, so
    a machine that drifts moves both sides of ckpt_vs_base alike; the report keeps its documented order."""
    import vlmfast.run.bench as bench

    order, real = [], bench.run_workload

    def recording(backend, requests, sizes, batch_size):
        order.append((str(backend.loaded.source), batch_size))
        return real(backend, requests, sizes, batch_size)

    monkeypatch.setattr(bench, "run_workload", recording)
    report = bench.run_bench(BenchOptions(ckpt=str(grpo_ckpt), compare_base=str(base_ckpt), synthetic=2,
                                          synthetic_size=56, batch_sizes="1,2", repeats=3, warmup=1, as_saved=False,
                                          generation=GenerationSettings(max_new_tokens=3, ignore_eos=True)))
    ck, base = str(grpo_ckpt), str(base_ckpt)
    named = [(ck if str(src).startswith(ck) else base if str(src).startswith(base) else src, bs) for src, bs in order]
    for bs in (1, 2):
        timed = [who for who, b in named if b == bs][2:]  # after one warm-up each
        assert timed == [ck, base] * 3, named
    assert [(s["name"], s["batch_size"]) for s in report["scenarios"]] == [(CKPT, 1), (CKPT, 2), (BASE, 1), (BASE, 2)]
    assert any("interleaved" in n for n in report["notes"]) and report["base_cache"]["found_off"] == []


def test_greedy_n_rates_count_every_delivered_answer_so_scenarios_compare(grpo_ckpt):
    """Greedy --n 2: plain generate (as saved) decodes each request once and copies the answer, vlmfast's loop
    decodes both rows. Both deliver the same answers, so tokens/s is samples/s times the answer length in each,
    and ckpt@B_vs_as_saved@1 is not inflated by --n."""
    from vlmfast.run.bench import run_bench

    report = run_bench(BenchOptions(ckpt=str(grpo_ckpt), synthetic=2, synthetic_size=56, batch_sizes="2", repeats=1,
                                    warmup=0, generation=GenerationSettings(max_new_tokens=4, n=2, ignore_eos=True)))
    for s in report["scenarios"]:
        assert s["tokens_per_s"] == pytest.approx(4 * s["samples_per_s"], rel=1e-3), s["name"]


def test_bench_with_n_gives_the_paired_interval_and_a_p_value(grpo_ckpt, images, tmp_path):
    """--n 4 against the same weights with the same seed: every request's 4 answers are the same on both sides,
    its score a mean of 4 (the truth is one of its answers). The interval is Newcombe's on the means, not the
    bootstrap's [0, 0], and the p-value is the sign-flip test's, as a sweep's."""
    from conftest import cli, read_jsonl

    from vlmfast.run.options import InferOptions
    from vlmfast.run.runner import infer

    settings = GenerationSettings(max_new_tokens=2, n=4, temperature=1.0, seed=1)
    plain = tmp_path / "plain.jsonl"
    plain.write_text("".join(json.dumps({"id": f"q{i}", "image": str(p), "prompt": "Count."}) + "\n"
                             for i, p in enumerate(images[:6])))
    infer(InferOptions(ckpt=str(grpo_ckpt), manifest=str(plain), out=str(tmp_path / "r.jsonl"), generation=settings,
                       device="cpu"))
    rows = read_jsonl(tmp_path / "r.jsonl")
    truth = {r["id"]: r["text"] for r in rows if r["sample"] == 0}
    assert any(0 < sum(r["text"] == truth[rid] for r in rows if r["id"] == rid) < 4 for rid in truth)  # means, not 0/1
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps({"id": r["id"], "image": r["images"][0], "prompt": "Count.", "solution": r["text"],
                                            "scorer": "exact"}) + "\n" for r in rows if r["sample"] == 0))
    r = cli("bench", "--ckpt", grpo_ckpt, "--compare-base", grpo_ckpt, "--manifest", manifest, "--n", 4, "--temperature", 1,
            "--seed", 1, "--max-new-tokens", 2, "--repeats", 1, "--warmup", 0, "--no-as-saved", "--batch-sizes", 8, "--json")
    assert r.returncode == 0, r.stderr
    paired = json.loads(r.stdout)["accuracy"]["ckpt_vs_base@8"]
    assert paired["n"] == 6 and paired["difference"] == 0.0 and paired["accuracy_a"] not in (0.0, 1.0)
    assert paired["ci_low"] < -0.1 and paired["ci_high"] > 0.1 and paired["ci_low"] == -paired["ci_high"]
    assert paired["p_value"] == 1.0
    assert "sign-flip p = 1" in r.stderr
