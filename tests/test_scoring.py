"""Scorers, the GRPO format check, summaries and the paired comparison: pure functions, no model."""

from __future__ import annotations

import math

import pytest

from vlmfast.errors import UsageError
from vlmfast.scoring import (
    ROW_FIELDS, SCORERS, Score, box_iou, format_ok, mcnemar_exact, paired_comparison, parse_box,
    parse_choice, parse_number, rescore, resolve_scorer, score_answer, score_row, summarize, truth_text,
)


@pytest.mark.parametrize("value, expected", [
    ("<answer> 3 </answer>", "3"),
    ("<think>hmm</think><answer>B</answer>", "B"),
    ("<answer>[1, 2, 3, 4]</answer>", [1, 2, 3, 4]),
    ("[1,2,3,4]", [1, 2, 3, 4]),
    ((1, 2, 3, 4), [1, 2, 3, 4]),
    ({"bbox_2d": [1, 2, 3, 4]}, {"bbox_2d": [1, 2, 3, 4]}),
    (3, "3"),
    (0.5, "0.5"),
    ("  Paris  ", "Paris"),
    ("[not json", "[not json"),
    ("", None),
    ("<answer>  </answer>", None),
    (None, None),
])
def test_truth_text(value, expected):
    assert truth_text(value) == expected


@pytest.mark.parametrize("truth, scorer", [
    ([10, 20, 30, 40], "bbox"),
    ("[10, 20, 30, 40]", "bbox"),
    ("<answer>[10, 20, 30, 40]</answer>", "bbox"),
    ([[10, 20, 30, 40]], "bbox"),
    ({"bbox_2d": [10, 20, 30, 40]}, "bbox"),
    ("(10,20),(30,40)", "bbox"),
    ("B", "choice"),
    ("(B)", "choice"),
    ("B.", "choice"),
    ("B)", "choice"),
    ("5", "number"),
    (5, "number"),
    ("<answer> 3 </answer>", "number"),
    ("-2.5", "number"),
    ("1,234", "number"),
    ("3/4", "number"),
    ("12 cm", "number"),
    ("50%", "number"),
    ("yes", "exact"),
    ("a", "exact"),  # a lower-case word, not an option letter
    ("Paris", "exact"),
    ([1, 2, 3], "exact"),
    ("2024-01-05", "exact"),
])
def test_auto_picks_scorer_by_truth_shape(truth, scorer):
    assert resolve_scorer(truth_text(truth)) == scorer
    assert score_answer("anything", truth).scorer == scorer  # resolved, never "auto"


@pytest.mark.parametrize("answer, truth, correct, parse_failed", [
    ("5", "5", True, False),
    ("so the count is 5", "5", True, False),
    ("There are 3 cats and 2 dogs, so 5 animals.", "5", True, False),
    ("1,234", "1234", True, False),
    ("1234", "1,234", True, False),
    ("1,2345", "2345", True, False),  # not a thousands group: 1 then 2345
    ("3/4", "0.75", True, False),
    ("0.75", "3/4", True, False),
    ("50%", "0.5", True, False),
    ("50", "50%", True, False),
    ("12 cm", "12", True, False),
    ("$5", "5", True, False),
    ("3.5kg", "3.5", True, False),
    ("1e3", "1000", True, False),
    ("5.0000001", "5", True, False),  # within the default relative tolerance
    ("5.001", "5", False, False),
    ("-3", "-3", True, False),
    ("3", "-3", False, False),
    ("between 3-5", "5", True, False),  # a range: "-5" is not negative five
    ("4 apples", "5", False, False),
    ("five", "5", False, True),
    ("", "5", False, True),
    ("1/0", "5", False, True),
    (None, "5", False, True),
])
def test_number_scorer(answer, truth, correct, parse_failed):
    s = score_answer(answer, truth, "number")
    assert (s.correct, s.parse_failed, s.scorer) == (correct, parse_failed, "number")
    assert s.score == (1.0 if correct else 0.0)


def test_number_tolerances_are_settable():
    assert not score_answer("5.0000001", "5", "number", rel_tol=0, abs_tol=0).correct
    assert score_answer("5.01", "5", "number", rel_tol=0.01).correct


@pytest.mark.parametrize("answer, truth, correct, parse_failed", [
    ("B", "B", True, False),
    ("(B)", "B", True, False),
    ("B.", "B", True, False),
    ("B)", "B", True, False),
    ("b", "B", True, False),
    ("B. a cat", "B", True, False),
    ("(B) a cat", "B", True, False),
    ("Option B", "B", True, False),
    ("option (B)", "B", True, False),
    ("The answer is B.", "B", True, False),
    ("Answer: B", "B", True, False),
    ("I think C", "B", False, False),
    ("C", "(B)", False, False),
    ("B", "B.", True, False),
    ("bird", "B", False, True),
    ("the answer is a dog", "B", False, True),
    ("A or B", "B", False, True),  # ambiguous: no letter chosen
    ("", "B", False, True),
    (None, "B", False, True),
])
def test_choice_scorer(answer, truth, correct, parse_failed):
    s = score_answer(answer, truth, "choice")
    assert (s.correct, s.parse_failed, s.scorer) == (correct, parse_failed, "choice")


@pytest.mark.parametrize("text, letter", [("B", "B"), ("(D) blue", "D"), ("option c", None), ("Z", "Z"), ("AB", None)])
def test_parse_choice(text, letter):
    assert parse_choice(text) == letter


@pytest.mark.parametrize("answer, truth, scorer, correct", [
    ("  Paris. ", "paris", "exact", True),
    ('"Paris"', "Paris", "exact", True),
    ("PARIS", "paris", "exact", True),
    ("New   York", "new york", "exact", True),
    ("Paris, France", "Paris", "exact", False),
    ("It is Paris.", "paris", "contains", True),
    ("Par", "paris", "contains", False),
    ("", "paris", "contains", False),
])
def test_exact_and_contains(answer, truth, scorer, correct):
    s = score_answer(answer, truth, scorer)
    assert (s.correct, s.scorer, s.parse_failed) == (correct, scorer, False)


@pytest.mark.parametrize("text, box", [
    ("[10, 20, 30, 40]", [10, 20, 30, 40]),
    ("[[10,20,30,40]]", [10, 20, 30, 40]),
    ("(10,20),(30,40)", [10, 20, 30, 40]),
    ("[[10, 20], [30, 40]]", [10, 20, 30, 40]),
    ('{"bbox_2d": [10, 20, 30, 40]}', [10, 20, 30, 40]),
    ('[{"bbox_2d": [10, 20, 30, 40], "label": "cat"}, {"bbox_2d": [50, 50, 60, 60]}]', [10, 20, 30, 40]),
    ('```json\n[\n  {"bbox_2d": [10, 20, 30, 40], "label": "dog"}\n]\n```', [10, 20, 30, 40]),
    ("The box is [10, 20, 30.5, 40].", [10, 20, 30.5, 40]),
    ('[{"bbox_2d": [10, 20, 30, 40], "label": "do', [10, 20, 30, 40]),  # truncated JSON
    ("no box here", None),
    ("[1, 2, 3]", None),
    ('{"label": "cat"}', None),
    ('{"bbox_2d": "abc"}', None),
    ("[NaN, 1, 2, 3]", None),
    ("[1e999, 0, 1, 1]", None),
    ("[" * 5000, None),
    ("", None),
])
def test_parse_box(text, box):
    assert parse_box(text) == box


@pytest.mark.parametrize("a, b, expected", [
    ([0, 0, 10, 10], [0, 0, 10, 10], 1.0),
    ([0, 0, 10, 10], [5, 5, 15, 15], 25 / 175),
    ([0, 0, 10, 10], [0, 0, 10, 20], 0.5),
    ([0, 0, 10, 10], [10, 0, 20, 10], 0.0),  # touching edges
    ([0, 0, 10, 10], [20, 20, 30, 30], 0.0),
    ([10, 10, 0, 0], [0, 0, 10, 10], 0.0),  # reversed corners
    ([0, 0, 0, 10], [0, 0, 0, 10], 0.0),  # zero area
    ([0, 0, float("nan"), 10], [0, 0, 10, 10], 0.0),
    ([0, 0, 10], [0, 0, 10, 10], 0.0),
    (None, [0, 0, 10, 10], 0.0),
    (["a", 0, 1, 1], [0, 0, 10, 10], 0.0),
])
def test_box_iou(a, b, expected):
    assert box_iou(a, b) == pytest.approx(expected)


# Original image 1000x600, model input 500x400: x scales by 2, y by 1.5.
SIZES = {"image_size": (1000, 600), "model_size": (500, 400)}


def test_bbox_maps_resized_prediction_to_original_pixels():
    s = score_answer("[50, 40, 250, 200]", [100, 60, 500, 300], "bbox", **SIZES)
    assert (s.iou, s.correct, s.bbox_unmapped) == (pytest.approx(1.0), True, False)
    # [50,40,150,200] → [100,60,300,300]: half the truth box → IoU 0.5, correct at ≥ 0.5
    half = score_answer("[50, 40, 150, 200]", [100, 60, 500, 300], "bbox", **SIZES)
    assert (half.iou, half.correct, half.score) == (pytest.approx(0.5), True, 1.0)
    assert not score_answer("[50, 40, 150, 200]", [100, 60, 500, 300], "bbox", iou=0.6, **SIZES).correct


def test_bbox_original_space_and_missing_sizes():
    # As is: inter 150x140 = 21000, union 32000 + 96000 - 21000 = 107000.
    expected = 21000 / 107000
    original = score_answer("[50, 40, 250, 200]", [100, 60, 500, 300], "bbox", bbox_space="original", **SIZES)
    assert (original.iou, original.correct, original.bbox_unmapped) == (pytest.approx(expected), False, False)
    missing = score_answer("[50, 40, 250, 200]", [100, 60, 500, 300], "bbox")
    assert (missing.iou, missing.bbox_unmapped) == (pytest.approx(expected), True)
    zero = score_answer("[50, 40, 250, 200]", [100, 60, 500, 300], "bbox", image_size=(1000, 600), model_size=(0, 400))
    assert zero.bbox_unmapped


@pytest.mark.parametrize("answer", [None, "", "no box", "[10, 10, 0, 0]", "[1, 2, 3]", "{" * 100, "[[[]]]"])
def test_malformed_bbox_answers_score_zero(answer):
    s = score_answer(answer, [0, 0, 10, 10], "bbox")
    assert (s.score, s.correct, s.iou) == (0.0, False, 0.0)


def test_unknown_scorer_and_space_raise_usage_errors():
    with pytest.raises(UsageError) as exc:
        score_answer("x", "y", "fuzzy")
    assert all(name in exc.value.hint for name in SCORERS)
    with pytest.raises(UsageError):
        score_answer("x", [0, 0, 1, 1], "bbox", bbox_space="normalized")
    with pytest.raises(UsageError):
        score_answer("x", None)


def test_score_is_frozen():
    s = score_answer("5", "5")
    assert isinstance(s, Score)
    with pytest.raises(AttributeError):
        s.score = 0.0


@pytest.mark.parametrize("text, ok", [
    ("<think>a</think><answer>b</answer>", True),
    ("  <think>\na\n</think>\n<answer> b </answer>\n", True),
    ("<think></think><answer></answer>", True),
    (None, False),
    ("", False),
    ("<answer>b</answer>", False),  # missing think
    ("<think>a</think>", False),  # missing answer
    ("a</think><answer>b</answer>", False),  # think opened by the template: not the full format
    ("<think>a<answer>b</answer>", False),  # unclosed think
    ("<think>a</think><answer>b", False),  # unclosed answer
    ("<think>a</think><think>c</think><answer>b</answer>", False),  # duplicated
    ("<think>a</think><answer>b</answer><answer>c</answer>", False),
    ("<answer>b</answer><think>a</think>", False),  # reversed
    ("<think>a<answer>b</answer></think>", False),  # nested
    ("<think>a</think>so<answer>b</answer>", False),  # text between
    ("Sure! <think>a</think><answer>b</answer>", False),  # text before
    ("<think>a</think><answer>b</answer> done", False),  # text after
    ("<think>a</answer></think><answer>b</answer>", False),
])
def test_format_ok(text, ok):
    assert format_ok(text) is ok


GOOD = "<think>count them</think><answer>5</answer>"


def test_score_row_fields():
    fields = score_row({"text": GOOD, "think": "count them", "answer": "5", "error": None}, "5", "auto")
    assert set(fields) == set(ROW_FIELDS)
    assert fields == {"score": 1.0, "correct": True, "format_ok": True, "scorer": "number", "iou": None,
                      "parse_failed": False, "bbox_unmapped": None}


def test_score_row_error_and_no_truth():
    assert score_row({"text": None, "error": "image not found"}, "5", "auto") == dict.fromkeys(ROW_FIELDS)
    fields = score_row({"text": GOOD, "answer": "5", "error": None}, None, "auto")
    assert fields["format_ok"] is True
    assert fields["score"] is fields["correct"] is fields["scorer"] is None


def test_score_row_bbox_uses_first_image_sizes():
    row = {"text": "<think>t</think><answer>[50, 40, 150, 200]</answer>", "answer": "[50, 40, 150, 200]",
           "image_sizes": [[1000, 600], [10, 10]], "model_image_sizes": [[500, 400], [28, 28]]}
    fields = score_row(row, [100, 60, 500, 300], "bbox")
    assert (fields["iou"], fields["correct"], fields["bbox_unmapped"]) == (0.5, True, False)
    del row["model_image_sizes"]
    fields = score_row(row, [100, 60, 500, 300], "bbox")
    assert fields["bbox_unmapped"] is True and fields["correct"] is False


def test_score_row_plain_answers_from_base_models():
    plain = {"text": "The answer is 5.", "think": None, "answer": None}
    assert score_row(plain, "5", "auto")["correct"] is True
    assert score_row(plain, "5", "auto", plain_fallback=False)["parse_failed"] is True
    truncated = {"text": "<think>I count 5 so far", "think": "I count 5 so far", "answer": None}
    fields = score_row(truncated, "5", "auto")
    assert (fields["correct"], fields["parse_failed"], fields["format_ok"]) == (False, True, False)


def test_rescore_maps_ids_to_truths():
    rows = [
        {"id": "a", "text": GOOD, "think": "count them", "answer": "5", "error": None},
        {"id": "b", "text": "<think>x</think><answer>(C)</answer>", "answer": "(C)", "error": None},
        {"id": "c", "text": GOOD, "answer": "5", "error": None},  # not in the manifest
        {"id": "d", "text": None, "answer": None, "error": "boom"},
    ]
    out = rescore(rows, {"a": ("<answer>5</answer>", None), "b": ("C", "choice"), "d": ("1", None)})
    assert [r["correct"] for r in out] == [True, True, None, None]
    assert [r["scorer"] for r in out] == ["number", "choice", None, None]
    assert out[2]["format_ok"] is True and out[3]["format_ok"] is None
    assert "score" not in rows[0]  # inputs are not modified
    assert rescore(rows[:1], {"a": ("5", None)}, default_scorer="exact")[0]["scorer"] == "exact"
    with pytest.raises(UsageError):
        rescore(rows, {}, default_scorer="nope")


def _row(score, scorer, fmt, think, answer, parse_failed=False, error=None):
    return {"error": error, "score": score, "correct": None if score is None else score == 1.0, "scorer": scorer,
            "format_ok": fmt, "think": think, "answer": answer, "parse_failed": None if score is None else parse_failed}


def test_summarize_small_table():
    rows = [
        _row(1.0, "number", True, "ab", "5"),
        _row(0.0, "number", True, "abcd", "x", parse_failed=True),
        _row(1.0, "choice", False, None, "B"),
        _row(None, None, False, "abcdef", None),  # no ground truth
        {"error": "boom", **dict.fromkeys(ROW_FIELDS), "think": None, "answer": None},
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
    r = paired_comparison(a, b, resamples=2000, seed=1)
    assert r["n"] == 20
    assert (r["accuracy_a"], r["accuracy_b"]) == (0.75, 0.45)
    assert r["difference"] == pytest.approx(0.3)
    assert r["ci_low"] < r["difference"] < r["ci_high"]
    # normal approximation: 0.3 ± 1.96·sqrt(0.31/20) ≈ [0.056, 0.544]
    assert r["ci_low"] == pytest.approx(0.056, abs=0.06) and r["ci_high"] == pytest.approx(0.544, abs=0.06)
    assert r["discordant"] == {"a_better": 7, "b_better": 1}
    # exact McNemar: 2 · (C(8,0) + C(8,1)) / 2^8 = 18/256
    assert r["p_value"] == pytest.approx(18 / 256)
    assert paired_comparison(a, b, resamples=2000, seed=1) == r  # deterministic for a seed


def test_paired_comparison_edges():
    empty = paired_comparison({"x": 1}, {"y": 0})
    assert empty["n"] == 0
    assert all(empty[k] is None for k in ("accuracy_a", "accuracy_b", "difference", "ci_low", "ci_high", "p_value", "discordant"))
    one = paired_comparison({"x": 1}, {"x": 0}, resamples=50)
    assert (one["n"], one["difference"], one["ci_low"], one["ci_high"]) == (1, 1.0, 1.0, 1.0)
    assert one["p_value"] == 1.0  # one discordant pair: 2 · ½ = 1
    graded = paired_comparison({"x": 0.5, "y": 1.0, "z": None}, {"x": 0.25, "y": 1.0, "z": 1.0}, resamples=50)
    assert graded["n"] == 2 and graded["p_value"] is None and graded["difference"] == pytest.approx(0.125)
    with pytest.raises(UsageError):
        paired_comparison({}, {}, confidence=1.5)


@pytest.mark.parametrize("a_only, b_only, p", [
    (0, 0, 1.0), (5, 0, 2 / 32), (0, 5, 2 / 32), (3, 3, 1.0), (10, 2, 2 * (1 + 12 + 66) / 4096),
])
def test_mcnemar_exact(a_only, b_only, p):
    assert mcnemar_exact(a_only, b_only) == pytest.approx(p)


def test_mcnemar_large_counts_do_not_underflow():
    p = mcnemar_exact(1500, 1400)
    assert 0 < p < 1 and math.isfinite(p)


def test_parse_number_reads_the_last_number():
    assert parse_number("first 3, then 4, finally 7.5") == (7.5, False)
    assert parse_number("12%") == (12.0, True)
    assert parse_number("no digits") is None
