"""A best step that holds up, on made runs: P(best) sums to 1 over the steps, two steps equal by
construction are both in the set not distinguishable from the best, a clearly better one is alone, and
Holm's adjustment equals a count by hand."""

import random

import pytest

from vlmfast.evaluation.best import best_step, holm, indistinguishable, p_best
from vlmfast.evaluation.flags import compare, flag_run, per_request


def _scores(n, right_rate, seed):
    rng = random.Random(seed)
    return {f"q{i}": float(rng.random() < right_rate) for i in range(n)}


def test_p_best_sums_to_one_and_is_the_same_for_a_seed():
    scores = {s: _scores(200, 0.6, s) for s in (100, 200, 300, 400, 500)}  # close: the chance is spread
    probabilities, n = p_best(scores)
    assert n == 200 and sum(probabilities.values()) == pytest.approx(1.0, abs=1e-9)
    assert all(0 <= p <= 1 for p in probabilities.values())
    assert p_best(scores) == (probabilities, n) and p_best(scores, seed=1) != (probabilities, n)


def test_two_equal_steps_share_the_chance_and_are_both_near_the_best():
    same = _scores(300, 0.7, 1)
    scores = {100: _scores(300, 0.4, 2), 200: same, 300: dict(same)}  # 200 and 300 equal by construction
    tables = {s: {rid: (v, bool(v), True) for rid, v in t.items()} for s, t in scores.items()}
    p_values = {s: compare(tables[s], tables[200])["p_value"] for s in (100, 300)}
    held = best_step(scores, 200, p_values)
    assert held["p_best"][200] == held["p_best"][300] == pytest.approx(0.5, abs=1e-9)  # every draw a tie
    assert held["indistinguishable"] == [200, 300] and held["holm_p"][300] == 1.0
    assert sum(held["p_best"].values()) == pytest.approx(1.0, abs=1e-4)


def test_a_clearly_better_step_is_alone():
    scores = {100: _scores(400, 0.5, 3), 200: _scores(400, 0.9, 4), 300: _scores(400, 0.55, 5)}
    tables = {s: {rid: (v, bool(v), True) for rid, v in t.items()} for s, t in scores.items()}
    p_values = {s: compare(tables[s], tables[200])["p_value"] for s in (100, 300)}
    held = best_step(scores, 200, p_values)
    assert held["indistinguishable"] == [200] and held["p_best"][200] == 1.0
    assert all(p < 0.05 for p in held["holm_p"].values())


def test_holm_by_hand():
    adjusted = holm({1: 0.01, 2: 0.04, 3: 0.03})
    assert adjusted == pytest.approx({1: 0.03, 3: 0.06, 2: 0.06})  # 3·0.01, max(2·0.03, 0.03), max(1·0.04, 0.06)
    keep, _ = indistinguishable(9, {1: 0.01, 2: 0.04, 3: 0.03, 4: None})
    assert keep == [2, 3, 4, 9]  # 1 is told apart; 4 shares no request with the best: not told apart


def test_collapse_after_peak_uses_the_same_test_as_the_set():
    """Step 300 is below the best's Wilson interval but the paired test, Holm-corrected, does not tell it
    apart from the best: not flagged (the old rule flagged it while the note called them indistinguishable)."""
    from vlmfast.evaluation.samples import accuracy_interval

    def rows(correct, n=40):
        return [{"id": f"q{i}", "correct": i < correct, "format_ok": True, "error": None} for i in range(n)]

    runs = {100: rows(20), 200: rows(34), 300: rows(28), 400: rows(12), 500: rows(33)}
    checkpoints = []
    for step, r in runs.items():
        right = sum(x["correct"] for x in r)
        low, high = accuracy_interval(right, len(r))
        checkpoints.append({"step": step, "accuracy": right / len(r), "ci_low": low, "ci_high": high})
    assert checkpoints[2]["accuracy"] < checkpoints[1]["ci_low"]  # below the best's interval ...
    tables = {s: per_request(r) for s, r in runs.items()}
    p_values = {s: compare(tables[s], tables[200])["p_value"] for s in runs if s != 200}
    keep, _ = indistinguishable(200, p_values)
    assert 300 in keep and 400 not in keep  # ... yet not told apart from it
    flagged = [f["step"] for f in flag_run(checkpoints, tables) if f["code"] == "collapse_after_peak"]
    assert flagged == [400]


def test_the_note_names_the_base_as_base_not_step_0():
    from vlmfast.evaluation.best import undistinguished_note

    figures = [{"step": 0, "label": "base"}, {"step": 100, "label": "hf-trainer"}, {"step": 200, "label": "hf-trainer"}]
    held = {"indistinguishable": [0, 100, 200], "p_best": {100: 0.6}, "holm_p": {0: 0.5, 200: 0.5}, "alpha": 0.05}
    (note,) = undistinguished_note(figures[1], figures, held)
    assert "not distinguishable from base, step 200:" in note and "step(s) 0" not in note
