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


def _needs_mathruler():
    pytest.importorskip("mathruler", reason="easyr1-math grades with mathruler (pip install mathruler sympy pylatexenc)")
    pytest.importorskip("pylatexenc", reason="mathruler's grade_answer needs pylatexenc")


def test_easyr1_math_rule():
    _needs_mathruler()
    got = score_reference("easyr1-math", {"text": "<think>x</think> so \\boxed{\\frac{1}{2}}"}, "0.5")
    assert (got["correct"], got["parse_failed"], got["scorer"]) == (True, False, "easyr1-math")
    last = score_reference("easyr1-math", {"text": "\\boxed{1} no, \\boxed{2}"}, "2")
    assert last["correct"] is True  # the last boxed answer
    none = score_reference("easyr1-math", {"text": "<answer>2</answer>"}, "2")
    assert (none["correct"], none["parse_failed"]) == (False, True)  # no \boxed: EasyR1's math reward gives 0
    assert score_row({"text": "\\boxed{[-2, 7]}"}, json.loads("[-2,7]"), "easyr1-math")["correct"] is True


def _tagged_manifest(tmp_path, truths: dict, answers: dict):
    """A manifest whose truths are written as given and a results file answering each id (JSONL both)."""
    from PIL import Image

    Image.new("RGB", (28, 28)).save(tmp_path / "a.png")
    manifest, results = tmp_path / "m.jsonl", tmp_path / "r.jsonl"
    manifest.write_text("".join(json.dumps({"id": k, "image": "a.png", "prompt": "How many?", "solution": t}) + "\n"
                                for k, t in truths.items()))
    results.write_text("".join(json.dumps({"id": k, "text": a, "finish_reason": "stop", "n_new_tokens": 3}) + "\n"
                               for k, a in answers.items()))
    return manifest, results


def _correct(rows) -> dict:
    return {r["id"]: r["correct"] for r in rows}


def test_r1v_counting_compares_with_the_truth_as_written_by_score(tmp_path):
    """R1-V's script compares the count with its line's ground_truth as json.loads gives it: a truth written
    "<answer>7</answer>" equals no int there (0), though vlmfast's own scorers read 7 in it (tags stripped)."""
    from vlmfast.run.rescore import rescore_file

    truths = {"tagged": "<answer>7</answer>", "text": "7", "int": 7}
    manifest, results = _tagged_manifest(tmp_path, truths, dict.fromkeys(truths, "<think>c</think><answer>7</answer>"))
    rescore_file(results, str(manifest), scorer="r1v-counting", out=tmp_path / "s.jsonl")
    assert _correct(json.loads(line) for line in (tmp_path / "s.jsonl").read_text().splitlines()) == {
        "tagged": False, "text": True, "int": True}
    rescore_file(results, str(manifest), out=tmp_path / "own.jsonl")  # vlmfast's own scorers: tags stripped, as before
    own = [json.loads(line) for line in (tmp_path / "own.jsonl").read_text().splitlines()]
    assert _correct(own) == dict.fromkeys(truths, True) and {r["scorer"] for r in own} == {"number"}


def test_reference_scorers_get_the_truth_as_written_from_truth_records_and_score_row():
    row = {"id": "c", "text": "<answer>7</answer>"}
    record = {"ground_truth": "7", "scorer": "r1v-counting", "manifest_truth": "<answer>7</answer>"}  # Request.truth_record()
    assert rescore([row], {"c": record})[0]["correct"] is False
    assert rescore([row], {"c": ("7", "r1v-counting")})[0]["correct"] is True  # (truth, scorer): that truth
    assert score_row(row, "7", "r1v-counting", as_written="<answer>7</answer>")["correct"] is False
    assert score_row(row, "<answer>7</answer>", "r1v-counting")["correct"] is False
    assert score_row(row, "<answer>7</answer>", "number")["correct"] is True  # an own scorer reads inside the tags
    box = _rec_row('{"bbox_2d": [0, 0, 10, 10]}')  # VLM-R1's script reads a JSON list; a box as text is read as it
    assert score_row(box, "<answer>[0, 0, 10, 10]</answer>", "vlm-r1-rec")["correct"] is True


def test_r1v_counting_in_infer_and_its_resume_get_the_truth_as_written(tmp_path):
    """infer scores as it answers, and a resume scores the kept rows again against a manifest edited since:
    both hand the reference scorer the truth as the line writes it."""
    from conftest import FakeBackend
    from vlmfast.run.options import InferOptions
    from vlmfast.run.runner import infer

    manifest, _ = _tagged_manifest(tmp_path, {"a": "<answer>7</answer>", "b": 7}, {})
    out = tmp_path / "out.jsonl"
    options = InferOptions(ckpt="fake", manifest=str(manifest), out=str(out), scorer="r1v-counting")
    infer(options, backend=FakeBackend(answers={"a": "7", "b": "7"}))
    assert _correct(json.loads(line) for line in out.read_text().splitlines()) == {"a": False, "b": True}
    manifest.write_text(manifest.read_text().replace('"solution": 7', '"solution": "<answer>7</answer>"'))
    infer(options, backend=FakeBackend(answers={"a": "7", "b": "7"}))  # every id answered: the kept rows rescored
    assert _correct(json.loads(line) for line in out.read_text().splitlines()) == {"a": False, "b": False}


def test_easyr1_math_grades_the_truth_as_written(tmp_path):
    """EasyR1's dataset hands the answer column to math.py as it is (verl/utils/dataset.py:
    example["ground_truth"] = example.pop(self.answer_key)), and mathruler grades "<answer>4</answer>" as that
    text: 0 for \\boxed{4}."""
    _needs_mathruler()
    from mathruler.grader import grade_answer

    from vlmfast.run.rescore import rescore_file

    assert grade_answer("4", "<answer>4</answer>") is False and grade_answer("4", "4") is True  # EasyR1's verdicts
    truths = {"tagged": "<answer>4</answer>", "plain": "4", "number": 4}
    manifest, results = _tagged_manifest(tmp_path, truths, dict.fromkeys(truths, "<think>x</think> so \\boxed{4}"))
    rescore_file(results, str(manifest), scorer="easyr1-math", out=tmp_path / "s.jsonl")
    assert _correct(json.loads(line) for line in (tmp_path / "s.jsonl").read_text().splitlines()) == {
        "tagged": False, "plain": True, "number": True}


def test_a_vlmr1_line_reaches_the_reference_scorers_as_its_second_turn_and_a_reward_re_wrapped(tmp_path):
    """VLM-R1's loader re-wraps a conversations line's second turn as "<answer> 3 </answer>" for its rewards; no
    published script reads that form: r1v-counting and easyr1-math get the turn as the line writes it."""
    pytest.importorskip("mathruler", reason="easyr1-math grades with mathruler")
    from PIL import Image

    from vlmfast.inputs.convert import read_reward_truths
    from vlmfast.run.rescore import rescore_file

    Image.new("RGB", (28, 28)).save(tmp_path / "a.png")
    lines = {"plain": "3", "tagged": "<answer>3</answer>", "half": "\\frac{1}{2}"}
    manifest, results = tmp_path / "v.jsonl", tmp_path / "r.jsonl"
    manifest.write_text("".join(json.dumps({"id": k, "image": "a.png", "conversations": [
        {"from": "human", "value": "<image>How many?"}, {"from": "gpt", "value": v}]}) + "\n" for k, v in lines.items()))
    answers = {"plain": "<answer>3</answer>", "tagged": "<answer>3</answer>", "half": "\\boxed{0.5}"}
    results.write_text("".join(json.dumps({"id": k, "text": a, "finish_reason": "stop", "n_new_tokens": 3}) + "\n"
                               for k, a in answers.items()))
    truths = read_reward_truths(str(manifest))
    assert truths["plain"]["manifest_truth"] == "<answer> 3 </answer>"  # what VLM-R1's rewards are handed
    assert truths["plain"]["reference_truth"] == "3"
    rescore_file(results, str(manifest), scorer="r1v-counting", out=tmp_path / "c.jsonl")
    counted = _correct(json.loads(line) for line in (tmp_path / "c.jsonl").read_text().splitlines())
    assert (counted["plain"], counted["tagged"]) == (True, False)  # R1-V: 3 == 3; "<answer>3</answer>" is no int
    rescore_file(results, str(manifest), scorer="easyr1-math", out=tmp_path / "m.jsonl")
    assert _correct(json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines())["half"] is True
