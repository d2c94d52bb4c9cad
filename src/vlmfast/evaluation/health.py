"""The shape of a checkpoint's answers: length, truncation, answer blocks, repetition, rewards.

What GRPO runs go wrong on shows in the answers before it shows in accuracy: responses that grow until
they hit the length limit or collapse to a few tokens, loops that repeat one phrase, several or empty
``<answer>`` blocks that a lenient reward still scores, sub-rewards (format) rising while accuracy
stays flat. :func:`health` gives those figures for one checkpoint's rows (standard library only).

Repetition, defined: the text is split into words — runs of non-space characters, except that each CJK
character (Chinese, Japanese kana, Korean syllables, their punctuation) is a word of its own, since those
scripts put no spaces between words. A row repeats when its text *ends* in one n-gram of 1 to
``REPEAT_MAX_N`` words repeated back to back at least ``REPEAT_MIN_TIMES`` times, the repeats together
covering at least ``REPEAT_MIN_WORDS`` words ("the the the the the the the the", "I think so. I think so.
I think so. I think so.") — the end, because a loop runs until the length limit stops it. Only the last
``REPEAT_TAIL_WORDS`` words are looked at (a longer loop counts the same). A text of fewer than
``REPEAT_MIN_WORDS`` words never repeats.
"""

from __future__ import annotations

import re

from vlmfast.timing import percentile

REPEAT_TAIL_WORDS = 60
REPEAT_MIN_WORDS = 8
REPEAT_MAX_N = 8
REPEAT_MIN_TIMES = 4
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_CJK = "\u3000-\u303f\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uff00-\uffef"
_WORD = re.compile(f"[{_CJK}]|[^\\s{_CJK}]+")
_HAS_CJK = re.compile(f"[{_CJK}]")

KEYS = ("mean_new_tokens", "new_tokens_p50", "new_tokens_p90", "new_tokens_max", "mean_think_chars",
        "mean_answer_chars", "truncation_rate", "no_answer_rate", "empty_answer_rate", "multi_answer_rate",
        "repetition_rate", "format_rate")


def repeats(text: str) -> bool:
    """Whether ``text`` ends in a loop (the module's definition)."""
    tail = _last_words(text, REPEAT_TAIL_WORDS)
    if len(tail) < REPEAT_MIN_WORDS:
        return False
    for n in range(1, REPEAT_MAX_N + 1):
        gram, times, end = tail[-n:], 0, len(tail)
        while end - n >= 0 and tail[end - n:end] == gram:
            times, end = times + 1, end - n
        if times >= REPEAT_MIN_TIMES and times * n >= REPEAT_MIN_WORDS:
            return True
    return False


def words_of(text: str) -> list[str]:
    """``text``'s words as the repetition rule counts them: runs of non-space characters, each CJK character
    one word."""
    # str.split is several times faster than the pattern, and the same words when no CJK character is there
    return _WORD.findall(text) if _HAS_CJK.search(text) else text.split()


def _last_words(text: str, k: int) -> list[str]:
    """The last ``k`` words of ``text`` (all, when it has fewer), splitting only its end: answers run to
    thousands of words and a sweep judges 5,000 of them per checkpoint."""
    end = text[-k * 16:]
    if len(end) == len(text):
        return words_of(text)[-k:]
    words = words_of(end)[1:]  # the first may be the cut end of a longer word
    return words[-k:] if len(words) >= k else words_of(text)[-k:]  # long words: split it all


def answer_blocks(text: str) -> list[str]:
    """Every ``<answer>…</answer>`` block of ``text``, in order."""
    return _ANSWER.findall(text)


def _mean(values) -> float | None:
    values = list(values)
    return round(sum(values) / len(values), 4) if values else None


def health(rows: list[dict]) -> dict:
    """The figures of :data:`KEYS` (and ``reward_means`` with ``--reward``) over the rows that ran (error rows
    left out): response length in tokens (mean, p50, p90, max), think and answer length in characters,
    the rates of truncation (``finish_reason`` length), no answer (no ``<answer>`` block and no stated
    answer), an empty answer block, several answer blocks, repetition (:func:`repeats`) and format. None
    where nothing can be averaged."""
    from vlmfast.evaluation.scoring import parse_reasoning

    ok = [r for r in rows if r.get("error") is None and isinstance(r.get("text"), str)]
    tokens = [int(r.get("n_new_tokens") or 0) for r in ok]
    parts = [parse_reasoning(r["text"]) for r in ok]
    blocks = [answer_blocks(r["text"]) for r in ok]
    p50, p90 = percentile(tokens, 50), percentile(tokens, 90)
    figures = {
        "mean_new_tokens": round(sum(tokens) / len(tokens), 2) if tokens else None,
        "new_tokens_p50": None if p50 is None else round(p50, 1),
        "new_tokens_p90": None if p90 is None else round(p90, 1),
        "new_tokens_max": max(tokens) if tokens else None,
        "mean_think_chars": _mean(len(think) for think, _ in parts if think is not None),
        "mean_answer_chars": _mean(len(answer) for _, answer in parts if answer is not None),
        "truncation_rate": _mean(r.get("finish_reason") == "length" for r in ok),
        "no_answer_rate": _mean(r.get("answer") is None and answer is None for r, (_, answer) in zip(ok, parts)),
        "empty_answer_rate": _mean(any(not b.strip() for b in found) for found in blocks),
        "multi_answer_rate": _mean(len(found) > 1 for found in blocks),
        "repetition_rate": _mean(repeats(r["text"]) for r in ok),
        "format_rate": _mean(bool(r["format_ok"]) for r in ok if r.get("format_ok") is not None),
    }
    given = [r["rewards"] for r in ok if isinstance(r.get("rewards"), dict)]
    if given:
        names = list(dict.fromkeys(n for g in given for n in g))
        figures["reward_means"] = {n: _mean(g[n] for g in given if isinstance(g.get(n), (int, float))) for n in names}
        figures["reward_mean"] = _mean(r["score"] for r in ok if isinstance(r.get("score"), (int, float)))
        subs = [r["reward_scores"] for r in ok if isinstance(r.get("reward_scores"), dict)]
        keys = list(dict.fromkeys(k for g in subs for k in g))  # EasyR1's format / accuracy, …: each one's mean
        figures["reward_score_means"] = {k: _mean(g[k] for g in subs if isinstance(g.get(k), (int, float))) for k in keys}
    return figures
