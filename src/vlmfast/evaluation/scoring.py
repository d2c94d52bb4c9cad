"""Score answers against ground truth and check the GRPO output format.

Pure functions on strings and dicts (standard library only) so ``vlmfast score`` runs without a
model. Scorers are picked by name; ``auto`` picks one from the shape of the ground truth.
Malformed answers score 0 and never raise: a model's output is data, not a bug. A row's think and
answer are always read from its ``text`` (:func:`parse_reasoning`), whoever wrote the row.
Figures over many rows, and comparing two runs, are :mod:`vlmfast.evaluation.stats`'s.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass

from vlmfast.errors import UsageError, check_choice
from vlmfast.evaluation.answers import stated_answer
# what an answer says (its text, number, option letter), importable from here where callers found it
from vlmfast.evaluation.reading import truth_text  # noqa: F401 - importable here
from vlmfast.evaluation.reading import (_LETTER_ONLY, is_number, normalize, parse_choice,  # noqa: F401
                                        parse_number)
# box parsing and coordinate spaces live in boxes; they stay importable from here, where callers found them
from vlmfast.evaluation.boxes import (BBOX_SPACES, BOX_POINTS, DEFAULT_BBOX_SPACE, box_iou, box_scale, parse_box,  # noqa: F401
                                      row_bbox_space)
from vlmfast.evaluation.reference import REFERENCE_SCORERS  # published evaluation scripts' rules, on the whole row

# SCORERS (every name --scorer and a manifest's "scorer" take) is made below from the registry of scorers
# The fields score_row adds to a result row (all null on error rows).
ROW_FIELDS = ("score", "correct", "format_ok", "scorer", "iou", "parse_failed", "bbox_unmapped")

_ANY_TAG = re.compile(r"</?(?:think|answer)>")


@dataclass(frozen=True)
class Score:
    """One scored answer. ``iou`` is set for bbox only; ``bbox_unmapped`` means a resized- or
    rel1000-space box was compared as is because the image sizes needed to map it back were missing."""

    score: float
    correct: bool
    scorer: str
    parse_failed: bool
    iou: float | None = None
    bbox_unmapped: bool = False


def parse_reasoning(text: str) -> tuple[str | None, str | None]:
    """(think, answer) from GRPO-style ``<think>…</think><answer>…</answer>`` output.

    An unclosed ``<think>`` keeps what was thought (truncated runs); a bare ``</think>`` (template
    opened the tag) takes the text before it; an unclosed ``<answer>`` is no answer. Absent → None.
    """
    think = answer = None
    if (start := text.find("<think>")) >= 0:
        close = text.find("</think>", start + len("<think>"))
        think = text[start + len("<think>"):close if close >= 0 else len(text)].strip()
    elif (close := text.find("</think>")) >= 0:
        think = text[:close].strip()
    if (start := text.find("<answer>")) >= 0 and (close := text.find("</answer>", start + len("<answer>"))) >= 0:
        answer = text[start + len("<answer>"):close].strip()
    return think, answer


def answer_in(text: str) -> str | None:
    """The answer ``text`` gives: its ``<answer>`` part, or, for a text with no ``<answer>`` tag at all (a
    base model answering plainly, or a think-then-answer format such as EasyR1's math prompt:
    ``<think>…</think> … \\boxed{12}``), the answer its untagged part states (:func:`stated_answer`); None
    when it gives none."""
    answer = parse_reasoning(text)[1]
    if answer is None and (tail := untagged_part(text)) is not None:
        answer = stated_answer(tail)
    return answer


def scored_answer(text, scorer: str | None, prompt=None, *, plain_fallback: bool = True) -> str | None:
    """The answer :func:`score_row` scores in a row's ``text`` under the concrete scorer ``scorer`` (a row's
    ``scorer`` field; None or a reward's name: no scorer-specific reading), so what the majority vote counts is
    what was scored: the ``<answer>`` part; else, with ``plain_fallback``, what the untagged part states
    (:func:`answer_in`), or for the text scorers ``exact`` and ``contains`` the whole untagged part (the length
    rule of :func:`stated_answer` guards choices and numbers, not texts); for ``choice`` with no option letter
    in it, the letter of the one option whose text it holds (:func:`option_by_text`, VLMEvalKit's
    ``can_infer_text``). None when the text gives no answer, or is no text."""
    if not isinstance(text, str):
        return None
    answer = parse_reasoning(text)[1]
    if answer is None and plain_fallback and (tail := untagged_part(text)) is not None:
        answer = stated_answer(tail)
        if answer is None and scorer in ("exact", "contains"):
            answer = tail.strip()
    if scorer == "choice" and (answer is None or parse_choice(answer) is None) \
            and (letter := option_by_text(answer or text, prompt)):
        answer = letter
    return answer


def untagged_part(text: str) -> str | None:
    """The part of ``text`` that states its answer when it has no ``<answer>`` tag: the whole text when it has
    no think/answer tag at all, what follows a closed ``</think>`` otherwise (lmms-eval strips the think part
    before scoring; EasyR1's math format puts the answer in ``\\boxed{}`` after it). None when the text has an
    ``<answer>`` tag (an unclosed one is no answer) or its thinking never closed (truncated)."""
    if not _ANY_TAG.search(text):
        return text
    if "<answer>" in text or "</answer>" in text:
        return None
    close = text.rfind("</think>")
    if close < 0 or text.find("<think>", close) >= 0:
        return None
    tail = text[close + len("</think>"):]
    return tail if tail.strip() else None  # nothing after the thinking: no answer (parse_failed), not an empty one


def reasoning_ends(text: str) -> tuple[int | None, int | None]:
    """Where the think part and the answer part of ``text`` end, as character offsets past their closing
    tags (an unclosed think runs to the end of the text); None for a part :func:`parse_reasoning` finds absent.
    Found with str.find, not a lazy pattern: answers run to thousands of words, and a sweep reads 5,000 of
    them per checkpoint several times."""
    think_end = None
    if (start := text.find("<think>")) >= 0:
        close = text.find("</think>", start + len("<think>"))
        think_end = close + len("</think>") if close >= 0 else len(text)
    elif (close := text.find("</think>")) >= 0:
        think_end = close + len("</think>")
    answer_end = None
    if (start := text.find("<answer>")) >= 0 and (close := text.find("</answer>", start + len("<answer>"))) >= 0:
        answer_end = close + len("</answer>")
    return think_end, answer_end


def resolve_scorer(truth, scorer: str = "auto") -> str:
    """The concrete scorer for ``truth``: ``scorer`` itself unless it is ``auto``.

    auto: a box (4 numbers, a list of boxes, ``{"bbox_2d": …}``, ``(x1,y1),(x2,y2)``) with x2 > x1 and y2 > y1
    → bbox; one letter A–Z, optionally ``(B)``/``B.``/``B)`` → choice; a number → number; else exact. Four
    numbers that are no box (a ranking ``[4, 3, 2, 1]``) are compared exactly: an IoU of 0 marked an identical
    answer wrong.
    """
    check_choice("scorer", scorer, SCORERS)
    if scorer != "auto":
        return scorer
    if isinstance(truth, (list, dict)):
        box = parse_box(truth)
        return "bbox" if box is not None and box[2] > box[0] and box[3] > box[1] else "exact"
    text = str(truth).strip()
    if BOX_POINTS.fullmatch(text):
        return "bbox"
    if (m := _LETTER_ONLY.match(text)) and m.group(1).isupper():
        return "choice"
    if is_number(text):
        return "number"
    return "exact"


def score_answer(answer, truth, scorer: str = "auto", *, iou: float = 0.5, image_size=None, model_size=None,
                 bbox_space: str = DEFAULT_BBOX_SPACE, rel_tol: float = 1e-6, abs_tol: float = 1e-9) -> Score:
    """Score one answer. ``image_size``/``model_size`` are (width, height) of the original image and of
    the model's resized input. A predicted box is mapped to original pixels before the IoU (the truth
    is in original pixels): from the resized image (``bbox_space="resized"``, needs both sizes), from
    0–1000 relative coordinates (``"rel1000"``, needs ``image_size``) or taken as is (``"original"``).
    ``answer=None`` (no answer) scores 0 with ``parse_failed``."""
    check_choice("bbox_space", bbox_space, BBOX_SPACES)
    truth = truth_text(truth)
    if truth is None:
        raise UsageError("no ground truth to score against", hint='give the record a "solution" or "answer"')
    name = resolve_scorer(truth, scorer)
    if answer is None:
        return Score(0.0, False, name, True, iou=0.0 if name == "bbox" else None)
    judge = _Judge(iou, image_size, model_size, bbox_space, rel_tol, abs_tol)
    return SCORER_FUNCTIONS[name](str(answer), truth, judge)


@dataclass(frozen=True)
class _Judge:
    """What a scorer may need beside the answer and the truth."""

    iou: float
    image_size: object
    model_size: object
    bbox_space: str
    rel_tol: float
    abs_tol: float


def _exact(answer: str, truth, judge: _Judge) -> Score:
    return _binary("exact", normalize(answer) == normalize(_as_text(truth)), False)


def _contains(answer: str, truth, judge: _Judge) -> Score:
    want = normalize(_as_text(truth))
    return _binary("contains", bool(want) and want in normalize(answer), False)


def _number(answer: str, truth, judge: _Judge) -> Score:
    got, want = parse_number(answer), parse_number(_as_text(truth))
    ok = got is not None and want is not None and _numbers_match(got, want, judge.rel_tol, judge.abs_tol)
    return _binary("number", ok, got is None)


def _choice(answer: str, truth, judge: _Judge) -> Score:
    got, want = parse_choice(answer), parse_choice(_as_text(truth))
    return _binary("choice", got is not None and got == want, got is None)


def _bbox(answer: str, truth, judge: _Judge) -> Score:
    return _score_bbox(answer, truth, judge.iou, judge.image_size, judge.model_size, judge.bbox_space)


# The registry of vlmfast's own scorers: name → function (answer text, truth, judge) → Score. --scorer's
# choices and help, manifests' per-row "scorer" and the dispatch above all read it; ``auto`` picks one of
# them by the truth's shape (resolve_scorer); REFERENCE_SCORERS read the whole row (score_row).
SCORER_FUNCTIONS = {"exact": _exact, "number": _number, "choice": _choice, "bbox": _bbox, "contains": _contains}
OWN_SCORERS = ("auto", *SCORER_FUNCTIONS)
SCORERS = (*OWN_SCORERS, *REFERENCE_SCORERS)




def _binary(name: str, ok: bool, parse_failed: bool) -> Score:
    return Score(1.0 if ok else 0.0, bool(ok), name, parse_failed)


def _as_text(truth) -> str:
    return truth if isinstance(truth, str) else json.dumps(truth, ensure_ascii=False)




def _numbers_match(got, want, rel_tol: float, abs_tol: float) -> bool:
    # "50%" may be written 50 or 0.5 on either side; accept either reading of a percentage.
    def readings(n):
        return (n[0], n[0] / 100) if n[1] else (n[0],)

    return any(math.isclose(a, b, rel_tol=rel_tol, abs_tol=abs_tol) for a in readings(got) for b in readings(want))




_OPTION_LINE = re.compile(r"^([A-Z])\. (.*)$", re.M)


def option_by_text(answer, prompt) -> str | None:
    """The letter of the one option whose text ``answer`` contains, the options read from a multiple-choice
    ``prompt`` as VLMEvalKit writes them ("Options:" then "A. text" lines): its ``can_infer_text``, which
    it falls back to when no letter is found — case-insensitive, and not for an answer over twice as long
    as the options' texts together. None when no option, or several, match."""
    if not isinstance(answer, str) or not isinstance(prompt, str) or "Options:\n" not in prompt:
        return None
    options = dict(_OPTION_LINE.findall(prompt.split("Options:\n", 1)[1]))
    if not options or len(answer) > 2 * sum(len(text) for text in options.values()):
        return None
    found = [letter for letter, text in options.items() if text.strip() and text.lower() in answer.lower()]
    return found[0] if len(found) == 1 else None


def _score_bbox(answer: str, truth, threshold: float, image_size, model_size, bbox_space: str) -> Score:
    want = parse_box(truth)
    got = parse_box(answer)
    unmapped = False
    if got is not None and bbox_space != "original":
        scale = box_scale(image_size, model_size if bbox_space == "resized" else (1000, 1000))
        if scale is None:
            unmapped = True  # compare as is, but say so: the IoU may be in the wrong pixel space
        else:
            got = [got[0] * scale[0], got[1] * scale[1], got[2] * scale[0], got[3] * scale[1]]
    value = box_iou(got, want) if got is not None and want is not None else 0.0
    ok = value >= threshold and value > 0
    return Score(1.0 if ok else 0.0, ok, "bbox", got is None, iou=value, bbox_unmapped=unmapped)


def format_ok(text: str | None) -> bool:
    """True when ``text`` is exactly ``<think>…</think><answer>…</answer>``: each tag once, in that
    order, nothing but whitespace outside the two blocks."""
    if text is None:
        return False
    tags = ("<think>", "</think>", "<answer>", "</answer>")
    if any(text.count(t) != 1 for t in tags):
        return False
    at = [text.index(t) for t in tags]
    if at != sorted(at):
        return False
    outside = text[: at[0]] + text[at[1] + len(tags[1]): at[2]] + text[at[3] + len(tags[3]):]
    return not outside.strip()


def score_row(row: dict, truth, scorer: str | None = "auto", *, bbox_space: str | None = None,
              plain_fallback: bool = True, as_written=None, **opts) -> dict:
    """The scoring fields for one result row (see ``ROW_FIELDS``); ``opts`` go to :func:`score_answer`.

    ``as_written``: the ground truth as the file writes it (``Request.truth_record()["reference_truth"]``), where ``truth`` is
    the normalised one (``Request.truth``); the reference scorers get it, as their scripts get the dataset's
    value (EasyR1 grades ``"<answer>4</answer>"`` as that text, not as ``4``). None: ``truth`` as given.

    The answer is read from the row's ``text`` (an ``answer`` field, if any, is not consulted: other
    tools write none, or their own). Error rows get all nulls; rows without ground truth get only
    ``format_ok``. With ``plain_fallback`` a row whose text has no ``<answer>`` tag is scored on the answer its
    untagged part states (:func:`untagged_part`, :func:`stated_answer`): a base model answering plainly, so
    checkpoint and base are compared on the same questions, or what follows a closed ``</think>``. Boxes: see :func:`row_bbox_space`."""
    if row.get("error") is not None:
        return dict.fromkeys(ROW_FIELDS)
    text = row.get("text")
    fields = dict.fromkeys(ROW_FIELDS)
    fields["format_ok"] = format_ok(text)
    if truth_text(truth) is None:
        return fields
    if scorer in REFERENCE_SCORERS:
        from vlmfast.evaluation.reference import score_reference
        return {**fields, **score_reference(scorer, row, truth if as_written is None else as_written)}
    name = resolve_scorer(truth_text(truth), scorer or "auto")
    answer = scored_answer(text, name, row.get("prompt"), plain_fallback=plain_fallback)
    s = score_answer(answer, truth, name, image_size=_first_size(row.get("image_sizes")),
                     model_size=_first_size(row.get("model_image_sizes")),
                     bbox_space=row_bbox_space(row, bbox_space), **opts)
    fields.update(score=s.score, correct=s.correct, scorer=s.scorer, parse_failed=s.parse_failed)
    if s.scorer == "bbox":
        fields.update(iou=round(s.iou, 6), bbox_unmapped=s.bbox_unmapped)
    return fields


def _first_size(sizes):
    if isinstance(sizes, (list, tuple)) and sizes and isinstance(sizes[0], (list, tuple)) and len(sizes[0]) == 2:
        return tuple(sizes[0])
    return None


def rescore(results_rows: list[dict], truths: dict, *, default_scorer: str = "auto", iou: float = 0.5,
            bbox_space: str | None = None, plain_fallback: bool = True) -> list[dict]:
    """Copies of ``results_rows`` with the scoring fields set. ``truths`` maps row id → (truth, scorer), or
    → a ``Request.truth_record()`` (its ``reference_truth`` then goes to the reference scorers, see
    :func:`score_row`); ids missing from it are left unscored (null score, ``format_ok`` still set).
    ``bbox_space`` None: each row's own (see :func:`row_bbox_space`); given, it wins over every row's."""
    check_choice("--scorer", default_scorer, SCORERS)
    if bbox_space is not None:
        check_choice("--bbox-space", bbox_space, BBOX_SPACES)
    out = []
    for row in results_rows:
        entry = truths.get(str(row.get("id")), (None, None))
        if isinstance(entry, dict):
            truth, scorer = entry.get("ground_truth"), entry.get("scorer")
            written = entry.get("reference_truth", entry.get("manifest_truth"))
        else:
            (truth, scorer), written = entry, None
        fields = score_row(row, truth, scorer or default_scorer, iou=iou, bbox_space=bbox_space,
                           plain_fallback=plain_fallback, as_written=written)
        out.append({**row, **fields})
    return out
