"""Health figures of one checkpoint's answers, on rows made by hand: lengths, truncation, answer blocks and
the repetition rule on both sides of each of its bounds."""

import pytest

from vlmfast.evaluation.health import (
    REPEAT_MAX_N,
    REPEAT_MIN_TIMES,
    REPEAT_MIN_WORDS,
    health,
    repeats,
    words_of,
)


def _row(rid, text, tokens=10, finish="eos", **kw):
    return {"id": rid, "text": text, "n_new_tokens": tokens, "finish_reason": finish, "error": None,
            "answer": None, **kw}


def test_repetition_rule_on_both_sides_of_its_bounds():
    assert repeats("the " * REPEAT_MIN_WORDS)  # one word, 8 times
    assert not repeats("the " * (REPEAT_MIN_WORDS - 1))  # too short to judge
    assert repeats("Let me think. " * REPEAT_MIN_TIMES)  # a 3-word phrase 4 times = 12 words
    assert not repeats("Let me think. " * (REPEAT_MIN_TIMES - 1) + "So the answer is 4.")  # the loop did not end it
    assert not repeats("a b c d e f g h i j k l m n o p")  # no phrase repeats
    assert repeats("Some reasoning first, then " + "1 2 3 4 5 6 7 8 " * REPEAT_MIN_TIMES)  # an 8-word phrase
    assert not repeats("1 2 3 4 5 6 7 8 9 " * REPEAT_MIN_TIMES)  # a 9-word phrase is longer than the rule looks for
    assert not repeats("yes yes yes no yes yes yes yes")  # 4 at the end: fewer than 8 words in the loop
    assert (REPEAT_MIN_WORDS, REPEAT_MIN_TIMES, REPEAT_MAX_N) == (8, 4, 8)  # the bounds the lines above are built on
    assert not repeats("x y z " * (REPEAT_MIN_TIMES - 1))  # 9 words, but a phrase 3 times is not yet a loop
    assert repeats("x y z " * REPEAT_MIN_TIMES)
    assert not repeats("a b " * 3 + "c d " * 3)  # each 2-word phrase 3 times



def test_a_long_answer_is_judged_on_its_last_words():
    """Only the end of a long text is split; the verdicts equal splitting it all, long words included."""
    from vlmfast.evaluation.health import _last_words

    reasoning = " ".join(f"w{i}" for i in range(5000))
    assert repeats(reasoning + " wait," * REPEAT_MIN_WORDS) and not repeats(reasoning)
    long_words = reasoning + " " + " ".join("x" * 40 + str(i) for i in range(70))
    assert _last_words(long_words, 60) == words_of(long_words)[-60:]
    assert _last_words("ab" * 2000, 60) == ["ab" * 2000]


def test_cjk_characters_are_words_of_their_own():
    assert words_of("我想我想。 the cat, 1.5") == ["我", "想", "我", "想", "。", "the", "cat,", "1.5"]
    assert repeats("让我们看看" + "我想" * REPEAT_MIN_TIMES)  # a 2-character phrase 4 times = 8 words
    assert not repeats("让我们看看" + "我想" * (REPEAT_MIN_TIMES - 1))
    assert not repeats("所以答案是四个苹果和三个香蕉")  # 14 characters, no phrase repeating at the end


def test_health_figures_by_hand():
    rows = [
        _row("a", "<think>xx</think><answer>4</answer>", tokens=10, format_ok=True, answer="4"),
        _row("b", "<think>x</think><answer></answer>", tokens=20, format_ok=True),
        _row("c", "<answer>1</answer><answer>2</answer>", tokens=30, format_ok=False, answer="1"),
        _row("d", "no no " * 10, tokens=40, finish="length", format_ok=False),
        {"id": "e", "text": None, "error": "cannot decode image", "n_new_tokens": 0, "finish_reason": None},
    ]
    h = health(rows)
    assert h["mean_new_tokens"] == 25.0 and h["new_tokens_p50"] == 25.0 and h["new_tokens_max"] == 40
    assert h["new_tokens_p90"] == pytest.approx(37.0)
    assert h["truncation_rate"] == 0.25 and h["repetition_rate"] == 0.25
    assert h["empty_answer_rate"] == 0.25 and h["multi_answer_rate"] == 0.25
    assert h["no_answer_rate"] == 0.25  # d only: b has an (empty) block, so it answered, with nothing
    assert h["format_rate"] == 0.5 and h["mean_think_chars"] == 1.5
    assert "reward_means" not in h


def test_reward_means_per_function():
    rows = [_row("a", "<answer>1</answer>", rewards={"format": 1.0, "accuracy": 0.0}, score=1.0),
            _row("b", "<answer>2</answer>", rewards={"format": 1.0, "accuracy": 1.0}, score=2.0),
            _row("c", "x", rewards={"format": 0.0, "accuracy": None}, score=0.0)]
    h = health(rows)
    assert h["reward_means"] == {"format": 0.6667, "accuracy": 0.5} and h["reward_mean"] == 1.0


def test_nothing_to_average_is_none():
    h = health([{"id": "x", "text": None, "error": "boom"}])
    assert all(h[k] is None for k in ("mean_new_tokens", "new_tokens_p50", "truncation_rate", "repetition_rate"))
