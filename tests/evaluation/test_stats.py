"""Figures over scored rows and the paired comparison of two runs: pure functions, no model."""

from __future__ import annotations

import math

import pytest

from vlmfast.errors import UsageError
from vlmfast.evaluation.scoring import ROW_FIELDS
from vlmfast.evaluation.stats import mcnemar_exact, mean, paired_comparison, summarize


def test_mean():
    assert mean([1, 2, 6]) == 3.0 and mean(x for x in [True, False]) == 0.5 and mean([]) is None


def _row(score, scorer, fmt, think, answer, parse_failed=False, error=None):
    """A scored row whose text holds ``think`` and ``answer``; its own think/answer fields say something
    else, and summarize must not read them (the text is the source of truth)."""
    text = (f"<think>{think}</think>" if think is not None else "") + (f"<answer>{answer}</answer>" if answer is not None else "")
    return {"error": error, "text": text, "score": score, "correct": None if score is None else score == 1.0, "scorer": scorer,
            "format_ok": fmt, "think": "a stale field", "answer": None, "parse_failed": None if score is None else parse_failed}


def test_summarize_small_table():
    rows = [
        _row(1.0, "number", True, "ab", "5"),
        _row(0.0, "number", True, "abcd", "x", parse_failed=True),
        _row(1.0, "choice", False, None, "B"),
        _row(None, None, False, "abcdef", None),  # no ground truth
        {"error": "boom", **dict.fromkeys(ROW_FIELDS), "text": None},
    ]
    s = summarize(rows)
    assert s["scored"] == 3
    assert s["accuracy"] == pytest.approx(2 / 3) and s["mean_score"] == pytest.approx(2 / 3)
    assert s["format_rate"] == 0.5  # over the 4 successful rows
    assert s["answer_parse_failures"] == 1
    assert s["mean_think_chars"] == 4.0 and s["mean_answer_chars"] == 1.0
    assert s["by_scorer"] == {
        "choice": {"scored": 1, "accuracy": 1.0, "mean_score": 1.0, "answer_parse_failures": 0},
        "number": {"scored": 2, "accuracy": 0.5, "mean_score": 0.5, "answer_parse_failures": 1},
    }


def test_summarize_nothing_to_average():
    s = summarize([])
    assert s["scored"] == 0 and s["by_scorer"] == {}
    assert s["accuracy"] is s["mean_score"] is s["format_rate"] is s["mean_think_chars"] is None


def _pairs():
    # 20 shared ids: 7 only a correct, 1 only b correct, 8 both, 4 neither.
    pattern = [(1, 0)] * 7 + [(0, 1)] + [(1, 1)] * 8 + [(0, 0)] * 4
    a = {f"q{i}": x for i, (x, _) in enumerate(pattern)}
    b = {f"q{i}": y for i, (_, y) in enumerate(pattern)}
    a["only-a"], b["only-b"] = 1, 0  # not shared: ignored
    return a, b


def test_paired_comparison_binary():
    a, b = _pairs()
    r = paired_comparison(a, b)
    assert r["n"] == 20
    assert (r["accuracy_a"], r["accuracy_b"]) == (0.75, 0.45)
    assert r["difference"] == pytest.approx(0.3)
    assert r["discordant"] == {"a_better": 7, "b_better": 1}
    # exact McNemar: 2 · (C(8,0) + C(8,1)) / 2^8 = 18/256
    assert r["p_value"] == pytest.approx(18 / 256)
    # Newcombe's hybrid score interval (method 10) for 8 both right, 7 only a, 1 only b, 4 neither; reference:
    # Wilson intervals from statsmodels' proportion_confint(…, method="wilson") combined by Newcombe's formula.
    # It leaves out 0 while McNemar's exact p is above 0.05: two methods, near the line they can disagree
    assert r["ci_low"] == pytest.approx(0.025724, abs=1e-6) and r["ci_high"] == pytest.approx(0.515976, abs=1e-6)


def test_paired_comparison_edges():
    empty = paired_comparison({"x": 1}, {"y": 0})
    assert empty["n"] == 0
    assert all(empty[k] is None for k in ("accuracy_a", "accuracy_b", "difference", "ci_low", "ci_high", "p_value", "discordant"))
    one = paired_comparison({"x": 1}, {"x": 0})
    assert (one["n"], one["difference"], one["ci_high"]) == (1, 1.0, 1.0)
    assert one["ci_low"] == pytest.approx(-0.122109, abs=1e-6)  # one request flipped up tells little
    assert one["p_value"] == 1.0  # one discordant pair: 2 · ½ = 1
    graded = paired_comparison({"x": 0.5, "y": 1.0, "z": None}, {"x": 0.25, "y": 1.0, "z": 1.0})
    # means of several answers: the sign-flip test (one difference of 0.25: either sign as likely, p 1)
    assert graded["n"] == 2 and graded["p_value"] == 1.0 and graded["difference"] == pytest.approx(0.125)
    with pytest.raises(UsageError):
        paired_comparison({}, {}, confidence=1.5)


@pytest.mark.parametrize("a_only, b_only, p", [
    (0, 0, 1.0), (5, 0, 2 / 32), (0, 5, 2 / 32), (3, 3, 1.0), (10, 2, 2 * (1 + 12 + 66) / 4096),
])
def test_mcnemar_exact(a_only, b_only, p):
    assert mcnemar_exact(a_only, b_only) == pytest.approx(p)


@pytest.mark.parametrize("both, up, down, neither, low, high", [
    (38, 0, 2, 0, -0.165039, 0.044797),   # 2 of 40 flipped right → wrong
    (600, 5, 0, 395, 0.000163, 0.009855),  # 5 up, 0 down of 1,000: leaves out 0, McNemar p = 0.0625
    (3, 0, 0, 0, -0.561497, 0.561497),    # nothing discordant: not [0, 0] — 3 requests say little
    (0, 0, 0, 50, -0.071348, 0.071348),
    (0, 3, 0, 0, 0.205923, 1.0),          # 3 of 3 flipped up (p 0.25)
    (0, 5100, 4900, 0, 0.0004, 0.039584),  # thousands of discordant requests
])
def test_the_binary_interval_is_newcombes_hybrid_score(both, up, down, neither, low, high):
    """Newcombe (1998) method 10 with the continuity-corrected phi. Reference values: statsmodels 0.15's
    Wilson intervals (proportion_confint(…, method="wilson")) combined by Newcombe's formula."""
    pattern = [(1, 1)] * both + [(1, 0)] * up + [(0, 1)] * down + [(0, 0)] * neither
    r = paired_comparison({i: x for i, (x, _) in enumerate(pattern)}, {i: y for i, (_, y) in enumerate(pattern)})
    assert r["difference"] == pytest.approx((up - down) / len(pattern))
    assert r["ci_low"] == pytest.approx(low, abs=1e-6) and r["ci_high"] == pytest.approx(high, abs=1e-6)


def test_mcnemar_large_counts_do_not_underflow():
    p = mcnemar_exact(1500, 1400)
    assert 0 < p < 1 and math.isfinite(p)


def _means(rng, n, k):
    return {f"q{i}": rng.randint(0, k) / k for i in range(n)}


def test_steps_that_agree_on_every_request_keep_an_interval_with_several_answers():
    """20 requests × 4 answers, the same on both sides: an interval around 0 as wide as the requests allow, about
    K = 1's (10 right in both, 10 in neither: ±9.0 points), not the percentile bootstrap's [0, 0]."""
    import random

    same = _means(random.Random(100), 20, 4)
    assert any(0 < v < 1 for v in same.values())
    r = paired_comparison(same, dict(same))
    assert r["ci_low"] == pytest.approx(-0.139564, abs=1e-6) and r["ci_high"] == pytest.approx(0.139564, abs=1e-6)
    assert r["difference"] == 0.0 and r["p_value"] == 1.0
    binary = {f"q{i}": float(i < 10) for i in range(20)}
    k1 = paired_comparison(binary, dict(binary))
    assert k1["ci_high"] == pytest.approx(0.089757, abs=1e-6)
    assert 0.5 < r["ci_high"] / k1["ci_high"] < 2


def test_a_step_better_on_one_request_keeps_a_lower_bound_below_0():
    """Every difference 0 but one of +0.5: all of one sign. The bootstrap's lower bound was exactly 0."""
    import random

    base = _means(random.Random(100), 20, 4)
    better = dict(base, **{next(k for k, v in base.items() if v == 0.5): 1.0})
    r = paired_comparison(better, base)
    assert r["difference"] == pytest.approx(0.025)
    assert r["ci_low"] < -0.05 and r["ci_high"] > 0.1
    assert r["p_value"] == 1.0  # one request differs: the sign-flip test's 2 · ½


def test_the_interval_on_means_is_newcombes_on_0_1_scores():
    """One formula: 0/1 scores read as means give method 10's interval (test_paired_comparison_binary's table);
    a difference the same on every request, with no spread on either side, gets phi 0 (as an empty margin of
    the 2×2 table), not the bootstrap's point."""
    from vlmfast.evaluation.stats import _paired_score_interval

    xs = [1.0] * 8 + [1.0] * 7 + [0.0] * 1 + [0.0] * 4
    ys = [1.0] * 8 + [0.0] * 7 + [1.0] * 1 + [0.0] * 4
    assert _paired_score_interval(xs, ys, 0.95) == pytest.approx((0.025724, 0.515976), abs=1e-6)
    low, high = _paired_score_interval([0.5] * 50, [0.25] * 50, 0.95)
    assert low < 0.25 - 0.1 and high > 0.25 + 0.1
