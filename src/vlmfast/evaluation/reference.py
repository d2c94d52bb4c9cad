"""Published evaluation scripts' scoring rules, reproduced rule for rule, as named scorers.

``--scorer NAME`` (or a manifest row's ``scorer``) picks one; each reads the row's whole ``text`` as its
script reads the model's output, and gives the same verdict per row:

- ``vlm-r1-rec``: om-ai-lab/VLM-R1 ``src/eval/test_rec_r1.py`` at 90052f47 — the first
  ``<answer>…</answer>``; in it, the last box of four integers that has a ``{`` before it and a ``}``
  after it (its greedy ``\\{.*\\[(\\d+),\\s*(\\d+),\\s*(\\d+),\\s*(\\d+)]\\s*.*\\}``); none → ``[0, 0, 0, 0]``;
  the box mapped from the model's input size (``image_grid_thw`` × 14, which is the row's
  ``model_image_sizes``) to the original image (the row's ``image_sizes``); its own IoU (inclusive
  pixel intersection, exclusive areas); correct when IoU > 0.5, strictly.
- ``easyr1-math``: hiyouga/EasyR1 ``examples/reward_function/math.py`` at b44b311b — whitespace around
  ``<``, ``>``, ``/`` removed, the last ``\\boxed{…}`` taken by ``mathruler.grader.extract_boxed_content``
  and graded by ``mathruler.grader.grade_answer`` against the truth; the row's score is that accuracy
  (EasyR1 logs it as ``accuracy`` beside ``overall``). Needs the ``mathruler`` package (and its
  ``sympy``, ``pylatexenc``).
- ``r1v-counting``: Deep-Agent/R1-V ``src/eval/test_qwen2vl_counting_superclevr.py`` at bbbbe3dc — the
  first ``<answer>\\s*(\\d+)\\s*</answer>``, as an int, equal to the ground truth.

Each gets the ground truth as the file writes it (``Request.truth_record()["reference_truth"]``; a VLM-R1
``conversations`` line's second turn, not the answer-tagged solution VLM-R1's loader makes of it for rewards),
not the one vlmfast's own scorers read (tags stripped, JSON decoded, numbers as text): EasyR1's ``verl/utils/dataset.py`` hands the
answer column to the reward as it is (``example["ground_truth"] = example.pop(self.answer_key)``), and R1-V's
script compares with the line's ``ground_truth`` as ``json.loads`` gives it, so a truth written
``"<answer>4</answer>"`` matches neither ``\\boxed{4}`` nor ``<answer>4</answer>`` there, nor here. Where a
script has no verdict, vlmfast reads the truth as its own scorers do: ``vlm-r1-rec``'s script reads a JSON
list (a box as text is read as the box it spells), EasyR1's ``mathruler`` a string (a number, list or dict
from a parquet column is graded as its text), and R1-V's file holds JSON numbers (a truth that is an
integer's text, as a TSV cell or a text column holds it, is read as that integer).
"""

from __future__ import annotations

import json
import re

from vlmfast.errors import UsageError
from vlmfast.evaluation.boxes import parse_box
from vlmfast.evaluation.reading import truth_text

REFERENCE_SCORERS = ("vlm-r1-rec", "easyr1-math", "r1v-counting")
__all__ = ["REFERENCE_SCORERS", "easyr1_math", "r1v_count", "rec_box", "rec_iou", "rec_resize", "score_reference"]
REC_IOU = 0.5  # test_rec_r1.py: iou(...) > 0.5

_REC_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_REC_BOX = re.compile(r"\{.*\[(\d+),\s*(\d+),\s*(\d+),\s*(\d+)]\s*.*\}", re.DOTALL)
_COUNT = re.compile(r"<answer>\s*(\d+)\s*</answer>")
_MATH_SPACES = re.compile(r"\s*(<|>|/)\s*")
_INTEGER = re.compile(r"[-+]?\d+")


def score_reference(name: str, row: dict, truth) -> dict:
    """The scoring fields (``score``, ``correct``, ``scorer``, ``parse_failed``; ``iou``/``bbox_unmapped``
    for ``vlm-r1-rec``) of ``row`` against ``truth`` (as the manifest holds it) by the reference scorer ``name``."""
    text = row.get("text") if isinstance(row.get("text"), str) else ""
    if name == "vlm-r1-rec":
        return _rec(row, text, truth)
    if name == "easyr1-math":
        ok, failed = easyr1_math(text, truth)
    elif name == "r1v-counting":
        got = r1v_count(text)
        ok, failed = got is not None and got == _count_truth(truth), got is None
    else:
        raise UsageError(f"unknown reference scorer {name!r}", hint=f"choose one of: {', '.join(REFERENCE_SCORERS)}")
    return {"score": 1.0 if ok else 0.0, "correct": bool(ok), "scorer": name, "parse_failed": failed}


# -- VLM-R1 REC -----------------------------------------------------------------------------------
def rec_box(text: str) -> list[int] | None:
    """test_rec_r1.py's ``extract_bbox_answer``, None where it falls back to ``[0, 0, 0, 0]``."""
    answer = _REC_ANSWER.search(text)
    if answer and (box := _REC_BOX.search(answer.group(1).strip())):
        return [int(g) for g in box.groups()]
    return None


def rec_iou(box1, box2) -> float:
    """test_rec_r1.py's ``iou``, formula for formula. Where it divides by zero (both boxes empty) the
    script stops; here the IoU is 0."""
    inter_x1, inter_y1 = max(box1[0], box2[0]), max(box1[1], box2[1])
    inter_x2, inter_y2 = min(box1[2] - 1, box2[2] - 1), min(box1[3] - 1, box2[3] - 1)
    inter = (inter_x2 - inter_x1 + 1) * (inter_y2 - inter_y1 + 1) if inter_x1 < inter_x2 and inter_y1 < inter_y2 else 0
    union = (box1[2] - box1[0]) * (box1[3] - box1[1]) + (box2[2] - box2[0]) * (box2[3] - box2[1]) - inter
    return float(inter) / union if union else 0.0


def rec_resize(box, input_size, image_size) -> list[float]:
    """test_rec_r1.py's ``resize_bbox``: ``(width, height)`` of the model's input → of the original image."""
    (input_width, input_height), (image_width, image_height) = input_size, image_size
    return [box[0] / input_width * image_width, box[1] / input_height * image_height,
            box[2] / input_width * image_width, box[3] / input_height * image_height]


def _rec(row: dict, text: str, truth) -> dict:
    want = truth if _is_int_box(truth) else parse_box(truth_text(truth))
    got = rec_box(text)
    box = got if got is not None else [0, 0, 0, 0]
    sizes = _first(row.get("model_image_sizes")), _first(row.get("image_sizes"))
    unmapped = None in sizes or 0 in sizes[0]
    if not unmapped:
        box = rec_resize(box, *sizes)
    value = rec_iou(box, want) if want is not None else 0.0
    ok = value > REC_IOU
    return {"score": 1.0 if ok else 0.0, "correct": ok, "scorer": "vlm-r1-rec", "parse_failed": got is None,
            "iou": round(value, 6), "bbox_unmapped": unmapped}


def _is_int_box(value) -> bool:
    return isinstance(value, list) and len(value) == 4 and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                               for v in value)


def _first(sizes):
    if isinstance(sizes, (list, tuple)) and sizes and isinstance(sizes[0], (list, tuple)) and len(sizes[0]) == 2:
        return tuple(sizes[0])
    return None


# -- EasyR1 math ----------------------------------------------------------------------------------
def easyr1_math(text: str, truth) -> tuple[bool, bool]:
    """(correct, no boxed answer) by EasyR1's math reward's accuracy rule."""
    try:
        from mathruler.grader import extract_boxed_content, grade_answer
    except ImportError as exc:
        raise UsageError(f"the easyr1-math scorer grades with mathruler, which is not importable ({exc})",
                         hint="pip install mathruler sympy pylatexenc") from exc
    response = _MATH_SPACES.sub(r"\1", text)  # EasyR1: "handle qwen2.5vl-32b format"
    answer = extract_boxed_content(response)
    if not isinstance(truth, str):  # mathruler grades strings (an int raises AttributeError there): its text
        truth = truth_text(truth)
        truth = truth if isinstance(truth, str) else json.dumps(truth, ensure_ascii=False)
    return bool(grade_answer(answer, truth)), answer == "None" and "\\boxed{" not in response


# -- R1-V counting --------------------------------------------------------------------------------
def r1v_count(text: str) -> int | None:
    """R1-V's ``extract_number_answer``: the first ``<answer> N </answer>`` as an int, else None."""
    match = _COUNT.search(text)
    return int(match.group(1)) if match else None


def _count_truth(truth):
    """R1-V's ground truth is a JSON number; an integer's (or a number's) text, as a TSV cell holds it, is read
    as that number. Any other text (``"<answer>4</answer>"``) stays text and equals no count, as in R1-V."""
    if isinstance(truth, str) and _INTEGER.fullmatch(truth.strip()):
        return int(truth)
    if isinstance(truth, str):
        try:
            return float(truth)
        except ValueError:
            return truth
    return truth
