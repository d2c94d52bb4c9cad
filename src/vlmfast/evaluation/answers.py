"""Reading the answer an untagged text states, for scoring a model that answered without
``<answer>`` tags (a base model answering plainly)."""

from __future__ import annotations

import re

# An untagged text states an answer in \boxed{…}, in a last "answer is …" / "Answer: …" line, or by being
# short. Anything else is not an answer: a 2,800-character noise text with a stray "A" in it, or "Loo1Loo…"
# read against "1", must not score as right.
STATED_MAX_CHARS = 64
_BOXED = re.compile(r"\\boxed\{((?:[^{}]|\{[^{}]*\})*)\}")
_STATED_LINE = re.compile(r"(?:answer\s*(?:is|:)|answer\s+is\s*:)\s*(.+?)\s*\.?\s*$", re.I)


def stated_answer(text: str) -> str | None:
    """The answer an untagged text states: the last ``\\boxed{…}``; else what follows "answer is" or
    "Answer:" on its last line that says so; else the whole text when it is short (at most
    ``STATED_MAX_CHARS``); else None: a long text that states nothing is not scored as an answer."""
    if boxed := _BOXED.findall(text):
        return boxed[-1].strip()
    for line in reversed([line for line in text.strip().splitlines() if line.strip()]):
        if (m := _STATED_LINE.search(line)):
            return m.group(1).strip()
    return text.strip() if len(text.strip()) <= STATED_MAX_CHARS else None
