"""Flags and paired figures on runs made by hand: each run's answers are built to trip exactly one rule at a
known step, a clean run trips none, and flips and paired differences equal a count by hand."""

import pytest

from vlmfast.evaluation.flags import (
    REPETITION,
    TRUNCATION,
    compare,
    flag_run,
    flipped,
    per_request,
)
from vlmfast.evaluation.health import health
from vlmfast.evaluation.samples import accuracy_interval

N = 40  # requests per checkpoint


def _rows(correct, *, formatted=None, tokens=20, finish="eos", text=None, rewards=None):
    """N rows: request i is right when i < correct, answers in format when i < formatted (default: all)."""
    formatted = N if formatted is None else formatted
    rows = []
    for i in range(N):
        ok = i < formatted
        body = text or ("<think>t</think><answer>4</answer>" if ok else "4")
        row = {"id": f"q{i}", "text": body, "answer": "4", "n_new_tokens": tokens, "finish_reason": finish,
               "error": None, "correct": i < correct, "score": float(i < correct), "format_ok": ok}
        if rewards is not None:
            row.update(rewards={"format": rewards}, score=rewards)
        rows.append(row)
    return rows


def _sweep(runs: dict[int, list[dict]]):
    """A sweep's checkpoint figures and per-request tables from rows per step (step 0: base)."""
    checkpoints, tables = [], {}
    for step, rows in runs.items():
        scored = [r for r in rows if r.get("correct") is not None]
        right = sum(r["correct"] for r in scored)
        low, high = accuracy_interval(right, len(scored))
        checkpoints.append({"step": step, "label": "base" if step == 0 else "hf-trainer", "accuracy": right / len(scored),
                            "ci_low": low, "ci_high": high, **health(rows)})
        tables[step] = per_request(rows)
    return checkpoints, tables


def _codes(runs):
    checkpoints, tables = _sweep(runs)
    return [(f["code"], f["step"]) for f in flag_run(checkpoints, tables, base_step=0)]


CLEAN = {0: _rows(16), 100: _rows(20), 200: _rows(24), 300: _rows(24)}


def test_a_clean_run_has_no_flags():
    assert _codes(CLEAN) == []


def test_format_only_gain():
    # base: right on q0…q15, in format on q0…q9 only. The checkpoint: right on q0…q21, all in format: +15
    # points overall, but over q0…q9 (in format in both) both are right everywhere: a gain of 0 there
    base = _rows(16, formatted=10)
    assert _codes({0: base, 100: _rows(22)}) == [("format_only_gain", 100)]
    # base in format on q0…q19: the checkpoint also gains q16…q19 there (+20 points): a real gain
    assert _codes({0: _rows(16, formatted=20), 100: _rows(22)}) == []
    # fewer than MIN_COMMON requests in format in both: no verdict
    assert _codes({0: _rows(16, formatted=4), 100: _rows(22)}) == []


def test_length_blowup_and_collapse():
    assert _codes({0: _rows(16), 100: _rows(18, tokens=40), 200: _rows(18, tokens=10)}) == \
        [("length_blowup", 100), ("length_collapse", 200)]
    assert _codes({0: _rows(16), 100: _rows(18, tokens=39)}) == []  # 1.95×: under the bound


def test_truncation_and_repetition():
    truncated = _rows(16)
    for row in truncated[:3]:  # 3 of 40 = 7.5 % > 5 %
        row["finish_reason"] = "length"
    loop = _rows(16)
    for row in loop[:3]:
        row["text"] = "<think>" + "wait, " * 20
    assert _codes({0: _rows(16), 100: truncated, 200: loop}) == [("truncation", 100), ("repetition", 200)]
    two = _rows(16)
    for row in two[:2]:  # 5 %: not above
        row["finish_reason"] = "length"
    assert _codes({0: _rows(16), 100: two}) == []


def test_collapse_after_the_peak():
    runs = {0: _rows(10), 100: _rows(20), 200: _rows(34), 300: _rows(30), 400: _rows(12)}
    assert _codes(runs) == [("collapse_after_peak", 400)]  # 300 is inside the best's interval, 400 below it


def test_reward_up_while_accuracy_flat():
    runs = {0: _rows(16, rewards=0.5), 100: _rows(17, rewards=0.8), 200: _rows(30, rewards=0.8)}
    assert _codes(runs) == [("reward_without_accuracy", 100)]  # 200: accuracy rose too


def test_flips_and_paired_figures_by_hand():
    base = [{"id": f"q{i}", "correct": c, "format_ok": True, "error": None} for i, c in enumerate([1, 1, 0, 0, 1, 0])]
    ckpt = [{"id": f"q{i}", "correct": c, "format_ok": True, "error": None} for i, c in enumerate([1, 0, 1, 1, 1, 0])]
    a, b = per_request(ckpt), per_request(base)
    assert flipped(a, b) == {"right_to_wrong": ["q1"], "wrong_to_right": ["q2", "q3"]}
    got = compare(a, b)
    assert got["n"] == 6 and got["difference"] == pytest.approx(1 / 6, abs=1e-4)
    assert (got["right_to_wrong"], got["wrong_to_right"]) == (1, 2)
    assert got["p_value"] == 1.0  # McNemar on 2 vs 1 discordant pairs: 2 · (1 + 3) / 8, capped at 1
    assert got["ci_low"] <= got["difference"] <= got["ci_high"]


def test_several_answers_per_request_flip_by_majority():
    rows = [{"id": "q", "sample": k, "correct": c, "answer": a, "format_ok": True, "error": None}
            for k, (c, a) in enumerate([(True, "4"), (True, "4"), (False, "5")])]
    table = per_request(rows)
    assert table["q"] == (pytest.approx(2 / 3), True, True)
    assert table["q"][0] != 1.0  # not 0/1: the McNemar p-value is taken on the majority flips


def test_long_plain_answers_scored_right_are_right_in_the_flips():
    """A checkpoint answering in plain text over 64 characters, every answer right by `contains`, against a base
    whose answers are all wrong: the request flips wrong→right (the vote read no answer in the plain text)."""
    from vlmfast.evaluation.scoring import score_row

    long_text = "Looking at the plot, the quantity that keeps decreasing along every step is the gradient norm of it."

    def rows(text):
        return [{"id": "q", "sample": k, "text": text, "format_ok": False, "error": None,
                 **score_row({"id": "q", "text": text}, "gradient", "contains")} for k in range(3)]

    ckpt, base = rows(long_text), rows("<answer>loss</answer>")
    assert per_request(ckpt)["q"][:2] == (1.0, True)
    assert flipped(ckpt, base) == {"right_to_wrong": [], "wrong_to_right": ["q"]}


def test_several_answers_compare_by_mean_and_flip_by_majority_by_hand():
    """Two requests × 3 answers. q0: base 1 of 3 right (majority wrong), checkpoint 3 of 3 (right): +2/3, a
    wrong→right flip. q1: base 2 of 3 (right), checkpoint 1 of 3 (wrong): −1/3, a right→wrong flip."""
    def rows(pattern):
        return [{"id": rid, "sample": k, "correct": c, "answer": "4" if c else "5", "format_ok": True,
                 "error": None} for rid, answers in pattern.items() for k, c in enumerate(answers)]

    base = rows({"q0": [True, False, False], "q1": [True, True, False]})
    ckpt = rows({"q0": [True, True, True], "q1": [False, True, False]})
    got = compare(ckpt, base)  # rows, made into per-request tables
    assert got["n"] == 2 and got["difference"] == pytest.approx((2 / 3 - 1 / 3) / 2, abs=1e-4)
    assert (got["wrong_to_right"], got["right_to_wrong"], got["p_value"]) == (1, 1, 1.0)
    assert got == compare(per_request(ckpt), per_request(base))
    assert flipped(ckpt, base) == {"right_to_wrong": ["q1"], "wrong_to_right": ["q0"]}
    assert set(got) == {"n", "difference", "ci_low", "ci_high", "p_value", "right_to_wrong", "wrong_to_right"}


def test_steps_with_the_same_answers_under_n_keep_a_paired_interval():
    """Two steps whose 4 answers per request are the same (the same weights saved twice): the paired interval
    over 20 requests is Newcombe's on the means, around 0 and as wide as 20 requests allow, not [0, 0]."""
    def rows(right):
        return [{"id": f"q{i}", "sample": k, "correct": k < c, "answer": "A", "format_ok": True, "error": None}
                for i, c in enumerate(right) for k in range(4)]

    right = [0, 1, 2, 3, 4] * 4
    got = compare(per_request(rows(right)), per_request(rows(right)))
    assert (got["difference"], got["p_value"], got["right_to_wrong"], got["wrong_to_right"]) == (0.0, 1.0, 0, 0)
    assert got["ci_low"] == -got["ci_high"] and 0.05 < got["ci_high"] < 0.25


def test_a_clear_difference_keeps_a_small_p_value():
    base = [{"id": f"q{i}", "correct": False, "error": None} for i in range(100)]
    ckpt = [{"id": f"q{i}", "correct": True, "error": None} for i in range(100)]
    got = compare(ckpt, base)
    assert got["p_value"] == float(f"{2 / 2 ** 100:.4g}") and got["p_value"] > 0  # not rounded away to 0.0
    # 100 of 100 flipped up: Newcombe's interval (Wilson of 100/100 and 0/100 from statsmodels) is
    # [0.947683, 1], not the bootstrap's [1, 1]
    assert (got["difference"], got["ci_low"], got["ci_high"]) == (1.0, 0.9477, 1.0)


def test_without_base_only_the_rules_that_need_none():
    """The same runs as the base rules trip, without a base: no format, length or reward flag; truncation,
    repetition and collapse after the peak still show."""
    truncated = _rows(16, tokens=60)
    for row in truncated[:3]:
        row["finish_reason"] = "length"
    runs = {0: _rows(16, formatted=10, rewards=0.5), 100: _rows(34, rewards=0.9), 200: truncated}
    checkpoints, tables = _sweep(runs)
    for c in checkpoints:
        c["label"] = "hf-trainer"
    assert [(f["code"], f["step"]) for f in flag_run(checkpoints, tables, base_step=None)] == \
        [("truncation", 200), ("collapse_after_peak", 200)]
    with_base = [(f["code"], f["step"]) for f in flag_run(checkpoints, tables, base_step=0)]
    assert ("length_blowup", 200) in with_base and ("reward_without_accuracy", 100) not in with_base  # it gained


def test_a_flag_carries_its_figure_threshold_and_message():
    truncated = _rows(16)
    for row in truncated[:4]:
        row["finish_reason"] = "length"
    checkpoints, _ = _sweep({0: _rows(16), 100: truncated})
    by_rows = {0: _rows(16), 100: truncated}  # rows, not tables: flag_run makes the tables
    assert flag_run(checkpoints, by_rows, base_step=0) == [
        {"code": "truncation", "step": 100, "figure": 0.1, "threshold": TRUNCATION,
         "message": "step 100: 10% of answers stopped at the length limit"}]
    assert REPETITION == TRUNCATION == 0.05


def test_collapse_after_peak_bounds():
    """Below the best's ci_low after it: flagged; at ci_low, or below it before the best: not."""
    def run(*accuracies):
        return [{"step": s, "accuracy": a, "ci_low": 0.7 if a == 0.8 else 0.1, "ci_high": 0.9} for s, a in accuracies]

    assert flag_run(run((100, 0.5), (200, 0.8), (300, 0.7)), {}, base_step=None) == []  # 0.7 = the best's ci_low
    flags = flag_run(run((100, 0.5), (200, 0.8), (300, 0.69)), {}, base_step=None)
    assert [(f["code"], f["step"], f["figure"], f["threshold"]) for f in flags] == [("collapse_after_peak", 300, 0.69, 0.7)]
    assert flag_run(run((100, 0.2), (200, 0.8)), {}, base_step=None) == []  # before the peak: still learning


def test_with_several_answers_the_test_judges_the_mean_the_steps_are_ranked_by():
    """--n: the best is ranked by mean correctness; a step 0.6 points below it (interval −12 … +11 points) whose
    majority votes are right on 13 more requests and wrong on none must not be "told apart and below it"."""
    from vlmfast.evaluation.best import ALPHA

    def answers(spec):
        return [{"id": f"q{i}", "sample": s, "text": f"<answer>{'A' if s < c else 'B'}</answer>", "correct": s < c,
                 "score": float(s < c), "format_ok": True, "error": None} for i, c in enumerate(spec) for s in range(4)]

    best, later = answers([4] * 20 + [1] * 20), answers([3] * 33 + [0] * 7)  # means 0.625 and 0.619
    got = compare(later, best)
    assert got["difference"] < 0 and got["wrong_to_right"] == 13 and got["right_to_wrong"] == 0
    assert got["p_value"] >= ALPHA
    figures = [{"step": 100, "accuracy": 0.625, "ci_low": None}, {"step": 200, "accuracy": 0.6188, "ci_low": None}]
    assert not [f for f in flag_run(figures, {100: best, 200: later}) if f["code"] == "collapse_after_peak"]


def test_with_one_answer_per_request_the_test_is_still_mcnemar():
    from vlmfast.evaluation.stats import mcnemar_exact, sign_flip_exact

    assert sign_flip_exact([1.0] * 9 + [-1.0] * 2 + [0.0] * 5) == pytest.approx(mcnemar_exact(9, 2))
    assert sign_flip_exact([0.25, 0.5, -0.25]) == pytest.approx(6 / 8)  # of the 8 sign flips, 6 reach |0.5|


def test_a_gain_of_exactly_the_threshold_is_not_more_than_it():
    """0.46 − 0.41 is 0.05000000000000002 in floating point: 5 points, not "more than 5 points"."""
    assert 0.46 - 0.41 > 0.05  # the float arithmetic the rules must not trust
    n = 200
    base = {f"q{i}": (float(i < 82), i < 82, True) for i in range(n)}  # 41.0 %, every answer in format
    step = {f"q{i}": (float(i < 92), i < 92, True) for i in range(n)}  # 46.0 %
    figures = [{"step": 0, "accuracy": 0.41, "ci_low": 0.34, "ci_high": 0.48, "reward_mean": 0.41},
               {"step": 100, "accuracy": 0.46, "ci_low": 0.39, "ci_high": 0.53, "reward_mean": 0.46}]
    assert flag_run(figures, {0: base, 100: step}, base_step=0) == []
    figures[1].update(accuracy=0.4601, reward_mean=0.4601)  # just over: both rules trip
    assert [f["code"] for f in flag_run(figures, {0: base, 100: step}, base_step=0)] == \
        ["format_only_gain", "reward_without_accuracy"]


def test_a_flag_on_the_base_names_it_base_as_the_table_does():
    figures = [{"step": 0, "accuracy": 0.5, "ci_low": 0.4, "ci_high": 0.6, "truncation_rate": 0.2},
               {"step": 100, "accuracy": 0.5, "ci_low": 0.4, "ci_high": 0.6, "truncation_rate": 0.2}]
    messages = [f["message"] for f in flag_run(figures, {}, base_step=0)]
    assert messages == ["base: 20% of answers stopped at the length limit", "step 100: 20% of answers stopped at the length limit"]
    assert [f["message"] for f in flag_run(figures, {})][0].startswith("step 0: ")  # no --base: a step like any
