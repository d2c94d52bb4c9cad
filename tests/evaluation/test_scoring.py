"""Scorers, the GRPO format check and per-row scoring: pure functions, no model."""

from __future__ import annotations


import pytest

from vlmfast.errors import UsageError
from vlmfast.evaluation.scoring import (
    BBOX_SPACES, ROW_FIELDS, SCORERS, Score, box_iou, format_ok, parse_box, parse_choice, parse_number,
    parse_reasoning, reasoning_ends, rescore, resolve_scorer, row_bbox_space, score_answer, score_row, truth_text,
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
    ([4, 3, 2, 1], "exact"),  # four numbers that are no box (a ranking): an IoU of 0 marked the same answer wrong
    ("<answer>[4, 3, 2, 1]</answer>", "exact"),
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


# One answer read in each space against the truth [100, 60, 500, 300] (original pixels, image 1000x600):
# rel1000  → [100/1000·1000, 100/1000·600, 500/1000·1000, 500/1000·600] = the truth: IoU 1;
# resized  → ×2, ×1.5 = [200, 150, 1000, 750]: inter 300·150 = 45000, union 480000 + 96000 − 45000;
# original → as is: inter 400·200 = 80000, union 160000 + 96000 − 80000 = 176000 → 5/11.
@pytest.mark.parametrize("space, sizes, iou, unmapped", [
    ("rel1000", SIZES, 1.0, False),
    ("rel1000", {"image_size": (1000, 600)}, 1.0, False),  # the model's input size plays no part
    ("rel1000", {"model_size": (500, 400)}, 5 / 11, True),  # no original size: compared as is, and said
    ("resized", SIZES, 45000 / 531000, False),
    ("original", SIZES, 5 / 11, False),
    ("original", {}, 5 / 11, False),
])
def test_bbox_in_each_coordinate_space(space, sizes, iou, unmapped):
    s = score_answer("[100, 100, 500, 500]", [100, 60, 500, 300], "bbox", bbox_space=space, **sizes)
    assert (s.iou, s.bbox_unmapped, s.correct) == (pytest.approx(iou), unmapped, iou >= 0.5)
    assert BBOX_SPACES == ("resized", "original", "rel1000")


def test_rel1000_half_box():
    # [100, 100, 300, 500] → [100, 60, 300, 300]: half the truth box's area inside it → IoU 0.5
    s = score_answer('[{"bbox_2d": [100, 100, 300, 500]}]', [100, 60, 500, 300], "bbox", bbox_space="rel1000",
                     image_size=(1000, 600))
    assert (s.iou, s.correct) == (pytest.approx(0.5), True)


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


def test_the_answer_comes_from_the_text_not_an_answer_field():
    # Another tool's row: no answer field at all, only the text.
    assert score_row({"id": "q", "text": GOOD, "finish_reason": "eos"}, "5", "auto")["correct"] is True
    # A stale or foreign answer field is not consulted: the text says 5.
    assert score_row({"text": GOOD, "answer": "7", "error": None}, "5", "auto")["correct"] is True
    assert score_row({"text": "<think>t</think><answer>7</answer>", "answer": "5"}, "5", "auto")["correct"] is False


@pytest.mark.parametrize("text, ends", [
    ("<think>ab</think><answer>c</answer>", (17, 35)),
    ("<think>ab</think>\n<answer>c</answer> trailing", (17, 36)),
    ("<think>abc", (10, None)),  # unclosed think: runs to the end
    ("ab</think><answer>c</answer>", (10, 28)),  # think opened by the template
    ("<answer>5", (None, None)),
    ("plain text", (None, None)),
])
def test_reasoning_ends_agree_with_parse_reasoning(text, ends):
    assert reasoning_ends(text) == ends
    think, answer = parse_reasoning(text)
    assert (think is None, answer is None) == (ends[0] is None, ends[1] is None)


# Qwen2-VL-style box in 0–1000 coordinates, image 1000x600, the model saw 500x400.
REL_ROW = {"text": "<think>t</think><answer>[100, 100, 500, 500]</answer>", "image_sizes": [[1000, 600]],
           "model_image_sizes": [[500, 400]], "bbox_space": "rel1000"}


def test_bbox_space_explicit_then_row_then_resized():
    truth = [100, 60, 500, 300]
    assert row_bbox_space(REL_ROW) == "rel1000" and row_bbox_space(REL_ROW, "original") == "original"
    assert row_bbox_space({"bbox_space": None}) == "resized" and row_bbox_space({}) == "resized"
    assert score_row(REL_ROW, truth, "bbox")["iou"] == 1.0  # the row's own space
    assert score_row(REL_ROW, truth, "bbox", bbox_space="resized")["iou"] == round(45000 / 531000, 6)  # the caller's
    plain = {k: v for k, v in REL_ROW.items() if k != "bbox_space"}
    assert score_row(plain, truth, "bbox")["iou"] == round(45000 / 531000, 6)  # neither: resized
    rows = [{**REL_ROW, "id": "a"}, {**plain, "id": "b"}]
    truths = {"a": (truth, "bbox"), "b": (truth, "bbox")}
    assert [r["iou"] for r in rescore(rows, truths)] == [1.0, round(45000 / 531000, 6)]
    assert [r["iou"] for r in rescore(rows, truths, bbox_space="original")] == [round(5 / 11, 6)] * 2
    with pytest.raises(UsageError) as exc:
        rescore(rows, truths, bbox_space="normalized")
    assert "rel1000" in exc.value.hint


def test_parse_number_reads_the_last_number():
    assert parse_number("first 3, then 4, finally 7.5") == (7.5, False)
    assert parse_number("12%") == (12.0, True)
    assert parse_number("no digits") is None
    # digits inside a word are no number (random weights' "g0D" once scored as 0); a unit may follow one
    for word in ("Loo1Loo", " corner g0D", "abc3def", "x2.5", "H2O"):
        assert parse_number(word) is None, word
    assert parse_number("12cm") == (12.0, False) and parse_number("答案是3") == (3.0, False)


def test_untagged_text_is_scored_only_on_an_answer_it_states():
    """A 2,800-character noise text with stray standalone "A"s, or "Loo1Loo…" against "1", is not an answer;
    a short plain reply, a final "the answer is …" line and \\boxed{} are."""
    from vlmfast.evaluation.scoring import score_row, stated_answer

    noise = ("zq " * 300 + " A " + "xv " * 600)[:2800]
    assert score_row({"text": noise}, "A", "choice")["correct"] is False
    assert score_row({"text": "Loo1Loo" * 100}, "1", "number")["correct"] is False
    assert score_row({"text": "There are 3 cars."}, "3", "number")["correct"] is True
    assert score_row({"text": "Let me count. " * 10 + "\nSo the answer is B."}, "B", "choice")["correct"] is True
    assert stated_answer("work " * 40 + r"so \boxed{12}") == "12"


def test_accuracy_over_tagged_answers_is_reported_beside_the_overall():
    from vlmfast.evaluation.stats import summarize

    rows = [{"text": "<answer>1</answer>", "score": 1.0, "correct": True, "format_ok": True},
            {"text": "<answer>2</answer>", "score": 0.0, "correct": False, "format_ok": True},
            {"text": "1", "score": 1.0, "correct": True, "format_ok": False}]
    s = summarize(rows)
    assert s["accuracy"] == pytest.approx(2 / 3) and (s["tagged_accuracy"], s["tagged_rows"]) == (0.5, 2)


def test_a_long_untagged_text_equal_to_the_truth_scores_as_such():
    """The stated-answer length rule guards choices and numbers; a text scorer compares the whole text."""
    from vlmfast.evaluation.scoring import score_row

    truth = "The red cube sits to the left of the small green cylinder, behind the large metal sphere."
    assert len(truth) > 64
    exact = score_row({"text": truth}, truth, "exact")
    assert (exact["correct"], exact["parse_failed"], exact["scorer"]) == (True, False, "exact")
    assert score_row({"text": "I think: " + truth}, truth, "contains")["correct"] is True
    assert score_row({"text": "Something else entirely, " * 4}, truth, "exact")["correct"] is False
    long_choice = score_row({"text": "Let me look at each option carefully before I decide which one fits " * 2}, "B", "choice")
    assert long_choice["parse_failed"] is True  # still no answer read from a long text for a choice


def test_a_choice_answered_by_its_option_s_text_counts_as_vlmevalkit_counts_it():
    """VLMEvalKit's can_infer falls back to can_infer_text: no letter in the answer, but exactly one option's
    text (case-insensitive), read from the multiple-choice prompt its TSVs build."""
    from vlmfast.evaluation.scoring import score_row

    prompt = ("Question: What color is the box?\nOptions:\nA. red\nB. blue\nC. dark green\n"
              "Please select the correct answer from the options above. \n")

    def correct(text, truth="A"):
        return score_row({"text": text, "prompt": prompt}, truth, "choice")["correct"]

    assert correct("<think>…</think><answer>Red</answer>") and correct("dark green", truth="C")
    assert not correct("<think>…</think><answer>blue</answer>")  # B's text: B, not A
    assert not correct("red or blue") and not correct("<answer>purple</answer>")  # two options, or none
    assert not score_row({"text": "<answer>red</answer>"}, "A", "choice")["correct"]  # no options to read
    assert correct("<answer>A</answer>") and not correct("<answer>B. red</answer>")  # a letter still decides


def test_a_think_then_boxed_answer_is_scored_as_easyr1_formats_it():
    """EasyR1's math format prompt asks for <think>…</think> then \\boxed{}, no <answer> tag; R1-style templates
    put the answer after </think>. That answer is scored, not counted as unparsed (EasyR1's math reward: 1.0)."""
    row = {"text": "<think>The sides are 5 and 7.</think> The answer is \\boxed{12}."}
    s = score_row(row, "12")
    assert (s["scorer"], s["correct"], s["parse_failed"]) == ("number", True, False)
    assert score_row({"text": "<think>5 + 7</think>\n\n12"}, "12")["correct"] is True
    assert score_row({"text": "<think>5 + 7</think>\n\nParis"}, "Paris")["correct"] is True
    assert score_row({"text": "<think>5 + 7 = 12, so \\boxed{12}"}, "12")["parse_failed"] is True  # thinking never closed
    assert score_row({"text": "<think>x</think><answer>12"}, "12")["parse_failed"] is True  # unclosed answer: none


@pytest.mark.parametrize("answer, truth, correct", [
    ("\\frac{1}{2}", "-\\frac{1}{2}", False),  # a sign is not punctuation
    ("-\\frac{1}{2}", "-\\frac{1}{2}", True),
    ("[\\infty, 3)", "(-\\infty, 3]", False),  # an interval's brackets are part of it
    ("[-2,7]", "[-2,7]", True),  # a JSON-looking truth still matches itself
    ("[-2, 7]", "[-2,7]", True),
    ("(B)", "B", True),
    ("- yes", "yes", True),
])
def test_exact_keeps_signs_and_interval_brackets(answer, truth, correct):
    assert score_answer(answer, truth, "auto").correct is correct


@pytest.mark.parametrize("answer, truth, correct", [
    ("\\frac{3}{4}", "0.75", True),
    ("\\frac{3}{4}", "4", False),  # not the denominator
    ("-\\frac{1}{2}", "-0.5", True),
    ("\\dfrac{-1}{2}", "-1/2", True),
    ("12 cm^2", "12", True),  # a unit's exponent is not the answer
    ("12 cm^2", "2", False),
    ("2^3", "8", True),
    ("3 \\times 10^{5}", "300000", True),
])
def test_number_reads_latex_fractions_and_exponents(answer, truth, correct):
    assert score_answer(answer, truth, "number").correct is correct


@pytest.mark.parametrize("answer, truth, correct", [
    ("1 000", "1000", True),  # the SI style's spaces, as the whole answer
    ("1\u2009000\u2009000", "1000000", True),  # thin spaces anywhere
    ("1\u00a0000", "1000", True),
    ("there were 2 100", "100", True),  # plain spaces inside a sentence still part two numbers
    ("1 1/2", "1.5", True),  # a mixed number
    ("1 1/2", "0.5", False),
    ("-2 3/4", "-2.75", True),
    ("1\\frac{1}{2}", "1.5", True),  # not eleven halves
    ("1\\frac{1}{2}", "5.5", False),
    ("3 4/3", "1.3333333333", True),  # an improper fraction is not the rest of a mixed number
    ("-$5", "-5", True),
    ("-$5", "5", False),
    ("$-5", "-5", True),
    ("-$ 5", "-5", True),
])
def test_number_reads_spaced_thousands_mixed_numbers_and_signed_currency(answer, truth, correct):
    assert score_answer(answer, truth, "number").correct is correct


@pytest.mark.parametrize("truth", ["1 000", "1 1/2", "-$5", "1\u2009000"])
def test_auto_scores_such_truths_as_numbers(truth):
    assert resolve_scorer(truth) == "number"


@pytest.mark.parametrize("answer, truth", [
    ("1 1/2.", "1 1/2"), ("The answer is 3 1/2.", "3.5"), ("1\\frac{1}{2}.", "1.5"),  # a sentence's full stop
    ("1 000.", "1 000"), ("12 345.", "12345"),
])
def test_a_full_stop_after_a_mixed_number_or_spaced_thousands_is_no_part_of_it(answer, truth):
    assert score_answer(answer, truth).correct is True  # auto: these truths are numbers now; exact scored them right


@pytest.mark.parametrize("text", ["1" * 400 + " 1/2", "1" * 5000 + " 1/2", "1 " + "1" * 5000 + "/" + "2" * 5000,
                                  "1" * 400 + "\\frac{1}{2}"])
def test_runaway_digits_before_a_fraction_do_not_raise(text):
    parse_number(text)  # a model's degenerate output: read as before, never an OverflowError/ValueError
    assert score_answer(text, "0.5", "number").scorer == "number"


@pytest.mark.parametrize("truth", ["3 5/4", "1 0/2"])
def test_auto_does_not_take_an_improper_fraction_after_a_number_for_a_mixed_number(truth):
    assert resolve_scorer(truth) == "exact"


def test_an_untagged_answer_s_last_boxed_may_nest_braces():
    from vlmfast.evaluation.answers import stated_answer

    text = "We compute the sine. " * 5 + "So \\boxed{\\frac{\\sqrt{3}}{2}}"
    assert stated_answer(text) == "\\frac{\\sqrt{3}}{2}"
    assert score_row({"text": text}, "\\frac{\\sqrt{3}}{2}")["correct"] is True


def test_a_bracket_left_alone_at_an_end_is_punctuation():
    """Brackets are kept where they mean something (an interval, a tuple) and dropped where they are punctuation:
    "yes)" from a list, "(b" cut short."""
    from vlmfast.evaluation.scoring import normalize

    assert [normalize(t) for t in ("yes)", "(b", "[yes]", "((x))")] == ["yes", "b", "yes", "x"]
    assert normalize("(-\\infty, 3]") != normalize("[\\infty, 3)")


def test_full_width_letters_and_words_read_as_their_ascii():
    """Chinese benchmarks' answers come full-width: "Ｂ" is option B, "ｙｅｓ" is yes (NFKC)."""
    from vlmfast.evaluation.scoring import normalize, parse_choice

    assert parse_choice("Ｂ") == "B" and parse_choice("（Ｃ）") == "C"
    assert normalize("ｙｅｓ") == normalize("yes")


def test_the_pronoun_after_answer_is_not_option_i():
    from vlmfast.evaluation.scoring import parse_choice

    assert parse_choice("Answer: I think B") == "B"
    assert [parse_choice(t) for t in ("Answer: I", "The answer is I.", "Option I is right")] == ["I", "I", "I"]


def test_nothing_after_the_thinking_is_no_answer_not_an_empty_one():
    for text in ("<think>It is yes.</think>", "<think>It is yes.</think>\n\n  "):
        s = score_row({"text": text}, "yes")
        assert (s["correct"], s["parse_failed"]) == (False, True)


def test_the_unicode_minus_sign_is_a_minus():
    from vlmfast.evaluation.scoring import normalize

    assert normalize("\u22125") == normalize("-5") == "-5"
