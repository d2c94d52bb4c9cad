"""What an answer's text says, read as the scorers read it: its normalized text (:func:`normalize`), its number
(:func:`parse_number`: "1,234", "3/4", "\\frac{3}{4}", "2.5 × 10^3", "50%", "12 cm^2") and its option letter
(:func:`parse_choice`). Standard library only, like :mod:`vlmfast.evaluation.scoring`, which scores with them."""

from __future__ import annotations

import json
import math
import re
import unicodedata

_QUOTES = "\"'`“”‘’«»"
_STRIP = ".,;:!?<>*_~" + _QUOTES  # brackets and "-" are handled in normalize: a sign, an interval's ends
_PAIRS = {"(": ")", "[": "]", "{": "}", "（": "）"}
_UNIT = r"(?:\s*(?:%|[A-Za-z°µ²³]{1,6}\.?))?"
_GROUP = ",\u00a0\u2009\u202f"  # thousands: "1,234", and the SI style's no-break and thin spaces
_NUM = rf"(?:\d{{1,3}}(?:[{_GROUP}]\d{{3}}(?!\d))+|\d+)(?:\.\d+)?|\.\d+"
# A sign counts only at the start of a token: "3-5" is a range, not 3 and -5.
_NUMBER = re.compile(  # not inside a word: "g0D" and "Loo1Loo" hold no number (a unit may follow: "12cm")
    rf"(?:(?<![\w.])(?P<sign>[-+−])(?:[$€£¥₹]\s*)?)?(?<![A-Za-z\d.])(?P<num>{_NUM})(?P<exp>[eE][-+]?\d+)?"
    rf"(?:\s*/\s*(?P<den>{_NUM}))?(?P<pct>\s*%)?"
)
_CURRENCY = "$€£¥₹"
_FULL_NUMBER = re.compile(rf"^(?:[{_CURRENCY}]\s*[-+−]?|[-+−]?(?:[{_CURRENCY}]\s*)?)(?:{_NUM})(?:[eE][-+]?\d+)?(?:\s*/\s*(?:{_NUM}))?{_UNIT}$")
_LETTER_ONLY = re.compile(r"^[(\[]?([A-Za-z])[)\]]?[.:)]?$")
_LETTER_LEAD = re.compile(r"^(?:\(([A-Z])\)|([A-Z])[.):])\s")
_LETTER_KEYWORD = re.compile(r"(?i:option|choice|answer)(?:\s+(?i:is))?\s*[:\-]?\s*[(\[]?([A-Z])(?![A-Za-z])")
_LETTER_PAREN = re.compile(r"\(([A-Z])\)")
_LETTER_WORD = re.compile(r"(?<![A-Za-z'])([A-Z])(?![A-Za-z'])")
_PRONOUN_AFTER = re.compile(r"\s+[a-z]")  # "I think", "I believe": a word after "I" makes it the pronoun


def normalize(text: str) -> str:
    """Case-folded, whitespace collapsed (none around commas), surrounding punctuation and quotes stripped,
    a bullet's "- " and brackets around a single item ("(B)", "[yes]") removed. A leading minus is a sign
    ("-x" is not "x") and the brackets of a tuple, list or interval are kept ("(-\\infty, 3]" is not "[\\infty, 3)")."""
    text = unicodedata.normalize("NFKC", str(text)).replace("\u2212", "-")  # full-width forms; the minus sign as "-"
    text = re.sub(r"\s*,\s*", ",", " ".join(text.casefold().split()))
    while True:
        before = text
        text = text.strip(_STRIP + " ").rstrip("-")
        if text.startswith("- "):
            text = text[2:]
        if len(text) >= 2 and _PAIRS.get(text[0]) == text[-1] and "," not in text and _balanced(text[1:-1]):
            text = text[1:-1]
        elif text and not _balanced(text):  # a bracket left alone at an end: "yes)", "(b" (a list's "b)")
            text = text[:-1] if text[-1] in ")]}）" and _balanced(text[:-1]) else \
                text[1:] if text[0] in "([{（" and _balanced(text[1:]) else text
        if text == before:
            return text


def _balanced(text: str) -> bool:
    depth = 0
    for ch in text:
        depth += ch in "([{（"
        depth -= ch in ")]}）"
        if depth < 0:
            return False
    return depth == 0


# A mixed number: "1 1/2" and "1\\frac{1}{2}" are one and a half (a proper fraction right after a whole number).
_MIXED = re.compile(r"(?<![\w.,/])(\d+)(?:\s+|\s*(?=\\[dt]?frac))"
                    r"(?:(\d+)\s*/\s*(\d+)|\\[dt]?frac\s*\{\s*(\d+)\s*\}\s*\{\s*(\d+)\s*\})(?!\d|\.\d)")  # a full stop may end it
# "1 000" with plain spaces is one thousand only when it is the whole answer: elsewhere "2 100" may be two numbers.
_SPACED_THOUSANDS = re.compile(rf"^\s*[{_CURRENCY}]?[-+−]?[{_CURRENCY}]?\s*\d{{1,3}}(?: \d{{3}})+(?:\.\d+)?{_UNIT}[.!?]?\s*$")
_LATEX_FRAC = re.compile(r"\\[dt]?frac\s*\{\s*([-+−]?\s*\d[\d,]*(?:\.\d+)?)\s*\}\s*\{\s*(\d[\d,]*(?:\.\d+)?)\s*\}")
_TIMES_TEN = re.compile(r"(\d(?:\.\d+)?)\s*(?:[x×*·]|\\times|\\cdot)\s*10\s*\^\s*\{?\s*([-+−]?\d+)\s*\}?")
_POWER = re.compile(r"(?<![\w.^])(\d+(?:\.\d+)?)\s*\^\s*(?:\{\s*([-+−]?\d{1,3})\s*\}|([-+−]?\d{1,3})(?![\d.]))")
_EXPONENT_BEFORE = re.compile(r"\^\s*\{?\s*$")


def _power(m) -> str:
    try:
        return repr(float(m.group(1)) ** int((m.group(2) or m.group(3)).replace("−", "-")))
    except (OverflowError, ZeroDivisionError):
        return m.group(0)


def is_number(text: str) -> bool:
    """Whether the whole of ``text`` is one number, as the ``auto`` scorer asks of a truth."""
    text = str(text).strip()
    return bool(_FULL_NUMBER.match(text) or _SPACED_THOUSANDS.match(text)
                or re.fullmatch(r"[-+−]?\d+\s+\d+\s*/\s*\d+", text) and _MIXED.sub(_mixed, text) != text)


def _mixed(m) -> str:
    try:  # a model's runaway digits: int() refuses over 4,300 of them, and a whole past 1e308 is no float
        whole, num, den = int(m.group(1)), int(m.group(2) or m.group(4)), int(m.group(3) or m.group(5))
        return repr(whole + num / den) if 0 < num < den else m.group(0)
    except (ValueError, OverflowError):
        return m.group(0)


def parse_number(text: str):
    """The last number in ``text`` as ``(value, is_percent)``, or None. Accepts "1,234", "3/4",
    "\\frac{3}{4}", "1 1/2", "-2.5e3", "2.5 × 10^3", "2^3", "50%", "-$5", "12 cm", "12 cm^2" (an exponent is not
    the answer), "1\u2009000" (and "1 000" as the whole answer); the last one wins because reasoning states the
    result last."""
    text = str(text)
    if _SPACED_THOUSANDS.match(text):
        text = re.sub(r"(?<=\d) (?=\d{3})", "", text)
    text = _MIXED.sub(_mixed, text)
    text = _LATEX_FRAC.sub(lambda m: f"{m.group(1).replace(' ', '')}/{m.group(2)}", text)
    text = _TIMES_TEN.sub(lambda m: f"{m.group(1)}e{m.group(2).replace('−', '-')}", text)
    text = _POWER.sub(_power, text)  # 2^3 is 8; a unit's exponent (cm^2) is skipped below
    matches = [m for m in _NUMBER.finditer(text) if not _EXPONENT_BEFORE.search(text, 0, m.start())]
    if not matches:
        return None
    m = matches[-1]
    try:
        value = float(re.sub(f"[{_GROUP}]", "", m.group("num")) + (m.group("exp") or ""))
        if m.group("den"):
            den = float(re.sub(f"[{_GROUP}]", "", m.group("den")))
            if den == 0:
                return None
            value /= den
    except (ValueError, OverflowError):
        return None
    if m.group("sign") in ("-", "−"):
        value = -value
    return (value, bool(m.group("pct"))) if math.isfinite(value) else None


def parse_choice(text: str) -> str | None:
    """The option letter in ``text`` ("B", "(B)", "B.", "B. text", "Option B", "the answer is B"), or None.

    A lone letter may be lower case; inside a sentence only capitals count, so the article "a" in
    "the answer is a dog" is not read as option A."""
    text = unicodedata.normalize("NFKC", str(text)).strip()  # a full-width "Ｂ" (Chinese benchmarks) is "B"
    if (m := _LETTER_ONLY.match(text)):
        return m.group(1).upper()
    for pattern in (_LETTER_LEAD, _LETTER_KEYWORD):
        if (m := pattern.search(text)):
            letter = next(g for g in m.groups() if g)
            if not (letter == "I" and _PRONOUN_AFTER.match(text, m.end())):  # "Answer: I think B": the pronoun
                return letter
    for pattern in (_LETTER_PAREN, _LETTER_WORD):
        letters = set(pattern.findall(text))
        if len(letters) > 1:
            letters.discard("I")  # the pronoun: "I think C"
        if len(letters) == 1:
            return letters.pop()
    return None


_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def truth_text(value):
    """Normalise a ground truth value: ``<answer>…</answer>`` is stripped, JSON lists/dicts in a
    string are decoded (a bbox stays ``[x1, y1, x2, y2]``), numbers become strings. None and empty
    strings give None (no ground truth)."""
    if value is None:
        return None
    if isinstance(value, (list, dict)):
        return value
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (int, float)):
        return str(value)
    text = str(value)
    if (m := _ANSWER_TAG.findall(text)):
        text = m[-1]
    text = text.strip()
    if not text:
        return None  # an empty solution is no ground truth, not a truth that only "" matches
    if text[:1] in "[{":
        try:
            decoded = json.loads(text)
        except ValueError:
            return text
        return decoded if isinstance(decoded, (list, dict)) else text
    return text
