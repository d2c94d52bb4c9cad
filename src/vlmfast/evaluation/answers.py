"""Reading answers: the one an untagged text states, for scoring a model that answered without ``<answer>``
tags (a base model answering plainly), and a box answer in the image's own pixels."""

from __future__ import annotations

import re

from vlmfast.evaluation.boxes import box_scale, parse_box, row_bbox_space

# An untagged text states an answer in \boxed{…}, in a last "answer is …" / "Answer: …" line, or by being
# short. Anything else is not an answer: a 2,800-character noise text with a stray "A" in it, or "Loo1Loo…"
# read against "1", must not score as right.
STATED_MAX_CHARS = 64
_STATED_LINE = re.compile(r"(?:answer\s*(?:is|:)|answer\s+is\s*:)\s*(.+?)\s*\.?\s*$", re.I)


def last_boxed(text: str) -> str | None:
    """What the last ``\\boxed{…}`` in ``text`` holds, braces nested to any depth (``\\boxed{\\frac{\\sqrt{3}}{2}}``,
    as mathruler's ``extract_boxed_content`` reads it); None when there is none, or it never closes."""
    start = text.rfind("\\boxed{")
    while start >= 0:
        depth, i = 1, start + len("\\boxed{")
        for j in range(i, len(text)):
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            if depth == 0:
                return text[i:j].strip()
        start = text.rfind("\\boxed{", 0, start)
    return None


def stated_answer(text: str) -> str | None:
    """The answer an untagged text states: the last ``\\boxed{…}``; else what follows "answer is" or
    "Answer:" on its last line that says so; else the whole text when it is short (at most
    ``STATED_MAX_CHARS``); else None: a long text that states nothing is not scored as an answer."""
    if (boxed := last_boxed(text)) is not None:
        return boxed
    for line in reversed([line for line in text.strip().splitlines() if line.strip()]):
        if (m := _STATED_LINE.search(line)):
            return m.group(1).strip()
    return text.strip() if len(text.strip()) <= STATED_MAX_CHARS else None


def predicted_box(row: dict, bbox_space: str | None = None) -> list[float] | None:
    """A box row's predicted box in the original image's pixels, mapped as the bbox scorer maps it (the row's
    own ``bbox_space``, else resized); None when the answer holds no box or its image sizes are unknown."""

    got = parse_box(row.get("answer") or row.get("text") or "")
    space = row_bbox_space(row, bbox_space)
    if got is None or space == "original":
        return got
    sizes, model = row.get("image_sizes") or [None], row.get("model_image_sizes") or [None]
    scale = box_scale(sizes[0], model[0] if space == "resized" else (1000, 1000))
    return None if scale is None else [got[0] * scale[0], got[1] * scale[1], got[2] * scale[0], got[3] * scale[1]]
