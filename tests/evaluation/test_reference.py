"""vlmfast.evaluation.reference: published evaluation scripts' rules, rule for rule, as named scorers."""

from __future__ import annotations

import json

import pytest

from vlmfast.evaluation.reference import (
    r1v_count,
    rec_box,
    rec_iou,
    rec_resize,
    score_reference,
)
from vlmfast.evaluation.scoring import SCORERS, rescore, score_row


def _rec_row(answer: str, model=(28, 28), image=(28, 28)) -> dict:
    return {"id": "r", "text": f"<think>look</think><answer>{answer}</answer>", "model_image_sizes": [list(model)],
            "image_sizes": [list(image)]}


def test_reference_scorers_are_registered():
    assert {"vlm-r1-rec", "easyr1-math", "r1v-counting"} <= set(SCORERS)


def test_rec_box_is_the_last_integer_box_inside_braces():
    assert rec_box('<answer>{"bbox_2d": [1, 2, 3, 4]} then {"bbox_2d": [5, 6, 7, 8]}</answer>') == [5, 6, 7, 8]
    assert rec_box('<answer>[1, 2, 3, 4]</answer>') is None  # no braces: VLM-R1 falls back to [0, 0, 0, 0]
    assert rec_box('<answer>{"bbox_2d": [1.5, 2, 3, 4]}</answer>') is None  # integers only
    assert rec_box('<answer>{"a": [1,2,3,4]}, [9, 9, 20, 20]</answer>') == [1, 2, 3, 4]  # no } after the last box
    assert rec_box('{"bbox_2d": [1, 2, 3, 4]}') is None  # outside <answer>
    assert rec_box('<answer>{"b": [1,2,3,4]}</answer><answer>{"b": [5,6,7,8]}</answer>') == [1, 2, 3, 4]  # first answer


def test_rec_iou_is_vlm_r1s_formula():
    assert rec_iou([0, 0, 10, 10], [0, 0, 10, 10]) == 1.0
    assert rec_iou([0, 0, 10, 10], [5, 5, 15, 15]) == 25 / 175
    assert rec_iou([0, 0, 10, 10], [9, 0, 20, 10]) == 0.0  # a one-pixel overlap: its strict < makes it none
    assert rec_iou([0, 0, 10, 10], [20, 20, 30, 30]) == 0.0
    assert rec_iou([0, 0, 0, 0], [0, 0, 0, 0]) == 0.0  # the script divides by zero here


def test_rec_mapping_and_strict_threshold():
    assert rec_resize([14, 28, 28, 56], (28, 56), (56, 224)) == [28.0, 112.0, 56.0, 224.0]
    # [0, 0, 14, 28] in the 28×56 input is [0, 0, 28, 112] in the 56×224 original: ×2 wide, ×4 tall
    row = _rec_row('{"bbox_2d": [0, 0, 14, 28]}', model=(28, 56), image=(56, 224))
    assert score_reference("vlm-r1-rec", row, [0, 0, 28, 112]) == {
        "score": 1.0, "correct": True, "scorer": "vlm-r1-rec", "parse_failed": False, "iou": 1.0, "bbox_unmapped": False}
    unmapped_would_miss = score_reference("vlm-r1-rec", {**row, "model_image_sizes": None}, [0, 0, 28, 112])
    assert (unmapped_would_miss["correct"], unmapped_would_miss["bbox_unmapped"]) == (False, True)
    # inter (1 − 0 + 1)·(1 − 0 + 1) = 4, union 8 + 4 − 4 = 8: IoU exactly 0.5 is not correct (> 0.5, strictly)
    got = score_reference("vlm-r1-rec", _rec_row('{"b": [0, 0, 4, 2]}'), [0, 0, 2, 2])
    assert (got["iou"], got["correct"], got["score"]) == (0.5, False, 0.0)
    above = score_reference("vlm-r1-rec", _rec_row('{"b": [0, 0, 3, 2]}'), [0, 0, 2, 2])  # 4 / 6
    assert (above["iou"], above["correct"]) == (round(4 / 6, 6), True)


def test_rec_without_sizes_compares_as_is_and_says_so():
    row = {"id": "r", "text": '<answer>{"bbox_2d": [0, 0, 10, 10]}</answer>'}
    got = score_reference("vlm-r1-rec", row, [0, 0, 10, 10])
    assert (got["correct"], got["bbox_unmapped"], got["iou"]) == (True, True, 1.0)
    none = score_reference("vlm-r1-rec", {"id": "r", "text": "no answer"}, [0, 0, 10, 10])
    assert (none["correct"], none["parse_failed"], none["iou"]) == (False, True, 0.0)


def test_rec_through_score_row_and_rescore_with_a_json_truth():
    row = _rec_row('{"bbox_2d": [0, 0, 14, 28]}', model=(28, 56), image=(56, 224))
    fields = score_row(row, "[0,0,28,112]", "vlm-r1-rec")
    assert (fields["scorer"], fields["correct"], fields["format_ok"]) == ("vlm-r1-rec", True, True)
    rows = rescore([row], {"r": ([0, 0, 28, 112], "vlm-r1-rec")})
    assert rows[0]["correct"] is True and rows[0]["iou"] == fields["iou"]


def test_r1v_counting_rule():
    assert r1v_count("<think>…</think><answer> 4 </answer>") == 4
    assert r1v_count("<answer>4 apples</answer>") is None and r1v_count("<answer>-4</answer>") is None
    assert r1v_count("<answer>3</answer><answer>4</answer>") == 3
    row = {"id": "c", "text": "<think>count</think><answer>\n7\n</answer>"}
    assert score_reference("r1v-counting", row, 7)["correct"] is True
    assert score_reference("r1v-counting", row, "7")["correct"] is True  # vlmfast keeps a number as its text
    assert score_reference("r1v-counting", row, "seven")["correct"] is False
    wrong = score_reference("r1v-counting", {"id": "c", "text": "7"}, 7)
    assert (wrong["correct"], wrong["parse_failed"], wrong["score"]) == (False, True, 0.0)
    assert score_row(row, 7, "r1v-counting")["correct"] is True


def test_easyr1_math_rule():
    pytest.importorskip("mathruler")
    pytest.importorskip("pylatexenc")
    got = score_reference("easyr1-math", {"text": "<think>x</think> so \\boxed{\\frac{1}{2}}"}, "0.5")
    assert (got["correct"], got["parse_failed"], got["scorer"]) == (True, False, "easyr1-math")
    last = score_reference("easyr1-math", {"text": "\\boxed{1} no, \\boxed{2}"}, "2")
    assert last["correct"] is True  # the last boxed answer
    none = score_reference("easyr1-math", {"text": "<answer>2</answer>"}, "2")
    assert (none["correct"], none["parse_failed"]) == (False, True)  # no \boxed: EasyR1's math reward gives 0
    assert score_row({"text": "\\boxed{[-2, 7]}"}, json.loads("[-2,7]"), "easyr1-math")["correct"] is True
