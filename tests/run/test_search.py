"""--search coarse: a coarse pass, then the best's neighbours, on made accuracy curves."""

from __future__ import annotations

import pytest

from vlmfast.run.search import coarse_every, coarse_steps, neighbours_to_evaluate, search

STEPS = [100 * (i + 1) for i in range(24)]


def curve(peak_index: int):
    """A smooth curve over STEPS with its one peak at ``peak_index``."""
    return {s: round(0.9 - 0.03 * abs(i - peak_index), 4) for i, s in enumerate(STEPS)}


@pytest.mark.parametrize("peak", range(24))
def test_finds_the_peak_of_24_checkpoints_evaluating_at_most_12(peak):
    accuracy = curve(peak)
    evaluated = search(STEPS, accuracy.__getitem__)
    assert max(evaluated, key=lambda s: (accuracy[s], -s)) == STEPS[peak]
    assert len(evaluated) <= 12 and len(set(evaluated)) == len(evaluated)


def test_coarse_pass_takes_every_kth_and_the_last():
    assert coarse_every(24) == 3 and coarse_every(5) == 1
    assert coarse_steps(STEPS, 3) == STEPS[::3] + [STEPS[-1]]
    assert coarse_steps([10, 20, 30], 2) == [10, 30]


def test_neighbours_of_the_best_until_both_are_known_or_it_is_an_end():
    assert neighbours_to_evaluate([1, 2, 3, 4], {1: 0.1, 3: 0.5}) == [2, 4]
    assert neighbours_to_evaluate([1, 2, 3, 4], {2: 0.2, 3: 0.5, 4: 0.4}) == []
    assert neighbours_to_evaluate([1, 2, 3, 4], {1: 0.9, 3: 0.5}) == [2]  # the first step is an end
    assert neighbours_to_evaluate([1, 2], {1: None}) == []  # nothing to rank: no ground truth


def test_every_given_by_hand():
    evaluated = search(STEPS, curve(0).__getitem__, every=12)
    assert evaluated[:3] == [STEPS[0], STEPS[12], STEPS[23]] and STEPS[1] in evaluated


def test_sweep_search_coarse_finds_the_known_peak_of_a_made_run(grpo_ckpt, tmp_path, monkeypatch, images):
    """24 checkpoints whose accuracy peaks at step 1500: the sweep evaluates at most 12, names the peak
    best, and lists the steps it skipped."""
    import shutil

    import vlmfast.run.sweep as sweeping
    from vlmfast.run.options import InferOptions
    from vlmfast.run.sweep import SweepOptions, sweep

    run = tmp_path / "run"
    for step in STEPS:
        shutil.copytree(grpo_ckpt, run / f"checkpoint-{step}")
    accuracy = curve(STEPS.index(1500))
    seen = []

    def made(entry, options, models, out_dir, progress, say, tables, settings, *rest):  # notes, by, inputs, pages
        seen.append(entry.step)
        tables[entry.step] = {}
        return {"step": entry.step, "path": str(entry.path), "label": entry.label, "accuracy": accuracy[entry.step]}

    monkeypatch.setattr(sweeping, "_evaluate", made)
    infer = InferOptions(ckpt=str(run), images=[str(images[0])], prompt="p")  # checked before any step
    report = sweep(SweepOptions(run_dir=str(run), out_dir=str(tmp_path / "out"), infer=infer, search="coarse"))
    assert report["best"]["step"] == 1500 and len(seen) <= 12 and sorted(seen) == report["search"]["evaluated"]
    assert sorted(report["search"]["skipped"] + seen) == STEPS and report["search"]["every"] == 3
    assert any("--search coarse evaluated" in note for note in report["notes"])


def test_every_without_the_coarse_search_is_refused_not_ignored(tmp_path):
    from vlmfast.errors import UsageError
    from vlmfast.run.options import InferOptions
    from vlmfast.run.sweep import SweepOptions

    infer = InferOptions(ckpt=str(tmp_path), images=["x.png"], prompt="p")
    with pytest.raises(UsageError, match=r"--every 3 is the stride of --search coarse"):
        SweepOptions(run_dir=str(tmp_path), out_dir=str(tmp_path / "out"), infer=infer, every=3)
    assert SweepOptions(run_dir=str(tmp_path), out_dir=str(tmp_path / "out"), infer=infer, every=3, search="coarse").every == 3


@pytest.mark.parametrize("kwargs, message", [
    ({"watch": True, "poll_s": float("nan")}, "--poll nan"),  # crashed after every checkpoint was evaluated
    ({"watch": True, "poll_s": float("inf")}, "--poll inf"),
    ({"steps": ",,"}, "names no step"),  # evaluated nothing and exited 0
    ({"steps": " "}, "names no step"),
])
def test_sweep_options_that_would_fail_late_or_do_nothing_are_refused(tmp_path, kwargs, message):
    from vlmfast.errors import UsageError
    from vlmfast.run.options import InferOptions
    from vlmfast.run.sweep import SweepOptions

    infer = InferOptions(ckpt=str(tmp_path), images=["x.png"], prompt="p")
    with pytest.raises(UsageError, match=message) as exc:
        SweepOptions(run_dir=str(tmp_path), out_dir=str(tmp_path / "out"), infer=infer, **kwargs)
    assert exc.value.hint
