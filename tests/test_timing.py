import pytest

from vlmfast.timing import percentile, rounded, spread


def test_percentile_linear_interpolation_like_numpy():
    xs = [10.0, 1.0, 4.0, 3.0]
    assert percentile(xs, 0) == 1.0 and percentile(xs, 100) == 10.0
    assert percentile(xs, 50) == 3.5
    assert percentile(xs, 90) == pytest.approx(8.2)
    assert percentile([], 50) is None
    with pytest.raises(ValueError):
        percentile(xs, 101)


def test_spread_min_max_and_coefficient_of_variation():
    # mean 5, sample variance (9 + 1 + 1 + 9) / 3 → sd sqrt(20/3), CV 100 · sd / 5
    assert spread([2.0, 4.0, 6.0, 8.0]) == (2.0, 8.0, pytest.approx(100 * (20 / 3) ** 0.5 / 5))
    assert spread([3.0]) == (3.0, 3.0, None) and spread([]) == (None, None, None) and spread([0.0, 0.0])[2] is None
    assert rounded(1.23456) == 1.235 and rounded(None) is None


def test_step_times_on_a_cpu_are_clock_reads_in_order():
    from vlmfast.timing import StepTimes

    clock = StepTimes("cpu")
    for step in range(3):
        clock(step)
    times = clock.times()
    assert len(times) == 3 and clock.origin <= times[0] <= times[1] <= times[2]


def test_versions_read_the_same_whether_or_not_torch_was_imported(monkeypatch, tmp_path):
    """torch's __version__ names its build (2.14.1+cu130) where the package metadata may not: every record
    reads the metadata, so a resume in the same environment says no version changed."""
    import json
    import sys
    import types
    from importlib import metadata

    from vlmfast.run.sweep_record import compare
    from vlmfast.timing import versions

    before = versions()["torch"]
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(__version__=metadata.version("torch") + "+cu999"))
    assert versions()["torch"] == before == metadata.version("torch")
    record = tmp_path / "step-1.run.json"  # written by an earlier vlmfast that read the imported module's string
    record.write_text(json.dumps({"settings": {}, "versions": {**versions(), "torch": before + "+cu999"}}))
    assert compare(record, {}, "differs", hint="") is None


def test_decode_bandwidth_is_taken_at_the_rows_a_decode_step_computed(monkeypatch):
    """The mean decode batch leaves out each answer's first token (prefill chose it) and the first step:
    continuous batching, 4 rows, 16 answers, 512 row-steps in 125 steps decodes 4.0 rows a step, not 4.096;
    a static batch of 4 rows over 10 steps, 4."""
    from types import SimpleNamespace

    import vlmfast.engines.bandwidth as bandwidth
    from vlmfast.engines.rows import BatchTiming
    from vlmfast.run.summary import _bandwidth

    seen = []
    monkeypatch.setattr(bandwidth, "bandwidth_report", lambda shape, batch, *rest: seen.append(batch) or {})
    facts = SimpleNamespace(model_shape=object(), device_name=None)
    ok = [SimpleNamespace(n_prompt_tokens=10, n_new_tokens=31)]
    loop = BatchTiming(size=0, preprocess_s=0, ttft_s=0, decode_s=1.0, steps=125, new_tokens=0, row_steps=512, first_rows=16)
    static = BatchTiming(size=4, preprocess_s=0, ttft_s=0, decode_s=1.0, steps=10, new_tokens=0, row_steps=40)
    _bandwidth(facts, ok, [loop], 8.0)
    _bandwidth(facts, ok, [static], 8.0)
    assert seen == [4.0, 4.0]


def test_decode_bandwidth_of_a_continuous_run_leaves_its_admissions_out(monkeypatch):
    """Continuous batching reports a timing per admission (prefill only: no steps, no rows) beside the loop's:
    they decode nothing, so the mean decode batch is still the loop's rows per step, not the admissions' sizes."""
    from types import SimpleNamespace

    import vlmfast.engines.bandwidth as bandwidth
    from vlmfast.engines.rows import BatchTiming
    from vlmfast.run.summary import _bandwidth

    seen = []
    monkeypatch.setattr(bandwidth, "bandwidth_report", lambda shape, batch, *rest: seen.append(batch) or {})
    facts = SimpleNamespace(model_shape=object(), device_name=None)
    ok = [SimpleNamespace(n_prompt_tokens=10, n_new_tokens=31)]
    admissions = [BatchTiming(size=s, preprocess_s=0, ttft_s=0.1, decode_s=0.0, steps=0, new_tokens=0) for s in (4, 4, 4, 4)]
    loop = BatchTiming(size=0, preprocess_s=0, ttft_s=0, decode_s=1.0, steps=125, new_tokens=0, row_steps=512, first_rows=16)
    _bandwidth(facts, ok, [*admissions, loop], 8.0)
    assert seen == [4.0]
