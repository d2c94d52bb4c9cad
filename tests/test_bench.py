import json
import struct

import pytest

from conftest import vlmfast
from vlmfast.bench import AS_SAVED, BASE, CKPT, SCHEMA, RunStats, agreement, gate, ratio, scenario_summary, step_series
from vlmfast.engine import BatchTiming, SampleResult


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
    assert s["mean_think_tokens"] == 2.0  # words, without a tokenizer
    assert s["step_ms"] == step_series(runs) == [4.0, 4.0]  # step 0: median of 1, 3, 5, 7; step 1: of 2, 4, 6


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
    assert set(report["ratios"]) == {"ckpt_vs_base@1", "ckpt_vs_base@3", "ckpt_vs_as_saved@1", "ckpt_vs_as_saved@3"}
    assert report["fidelity"] == {"batch_1_vs_n": 1.0, "ckpt_vs_as_saved": 1.0}
    assert len(report["cache"]["found_off"]) == 3 and report["base_cache"]["found_off"] == []
    assert report["gates"]["exit_code"] == 0
    assert "ckpt-as-saved" in (rep / "report.md").read_text()
    assert json.loads((rep / "report.json").read_text())["scenarios"] == report["scenarios"]
    assert _png_size(rep / "plot.png") == (1320, 495)


def test_plot_has_a_line_per_scenario(tmp_path):
    from vlmfast.plot import step_lines, write_plot

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


@pytest.mark.parametrize("kind", ["grpo", "base"])
@pytest.mark.parametrize("factor", [1000.0, 1.0])
def test_slower_gate(request, base_ckpt, kind, factor):
    """X=1000 can never trip; X=1 trips exactly when ckpt measured slower than base. Either way the
    exit code must agree with the figures printed, for a GRPO-like and a base-like checkpoint."""
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
