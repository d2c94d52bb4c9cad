"""Flags and paired figures on runs made by hand: each run's answers are built to trip exactly one rule at a
known step, a clean run trips none, and flips and paired differences equal a count by hand."""

import pytest

from vlmfast.evaluation.flags import compare, flag_run, flipped, per_request
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
