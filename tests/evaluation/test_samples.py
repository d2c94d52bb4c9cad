"""vlmfast.evaluation.samples: pass@k, maj@k, solve rates and the Wilson interval, against hand-computed values."""

from __future__ import annotations

import math

import pytest

from vlmfast.evaluation.samples import SUMMARY_KEYS, accuracy_interval, ks_for, majority_correct, pass_at_k, summarize_samples


def _comb_pass_at_k(n, c, k):
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


@pytest.mark.parametrize(("n", "c", "k", "expected"), [
    (10, 3, 1, 0.3),
    (5, 2, 2, 0.7),  # 1 - C(3,2)/C(5,2) = 1 - 3/10
    (4, 1, 2, 0.5),  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    (4, 0, 1, 0.0),
    (4, 0, 4, 0.0),  # c = 0: no draw holds a correct sample
    (4, 4, 1, 1.0),  # c = n
    (4, 1, 4, 1.0),  # k = n: the one correct sample is always drawn
    (8, 6, 3, 1.0),  # n - c < k
    (200, 1, 100, 0.5),  # binomials of this size overflow float; the product form does not
])
def test_pass_at_k_hand_computed(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_matches_the_binomial_definition():
    for n in range(1, 12):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert pass_at_k(n, c, k) == pytest.approx(_comb_pass_at_k(n, c, k), abs=1e-12), (n, c, k)


@pytest.mark.parametrize(("n", "c", "k"), [(4, 1, 0), (4, 1, 5), (4, 5, 1), (4, -1, 1)])
def test_pass_at_k_rejects_impossible_arguments(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


def test_ks_for():
    assert ks_for(1) == [1]
    assert ks_for(2) == [1, 2]
    assert ks_for(6) == [1, 2, 4, 6]
    assert ks_for(8) == [1, 2, 4, 8]
    assert ks_for(16) == [1, 2, 4, 8, 16]
    assert ks_for(17) == [1, 2, 4, 8, 16, 17]
    with pytest.raises(ValueError):
        ks_for(0)


def _rows(rid, corrects, answers, scores=None):
    scores = scores or [float(c) for c in corrects]
    return [{"id": rid, "sample": i, "correct": bool(c), "score": s, "answer": a}
            for i, (c, a, s) in enumerate(zip(corrects, answers, scores))]


def test_summarize_samples_hand_computed():
    rows = (_rows("a", [1, 1, 0, 0], ["5", "5 ", "7", "7"])  # tie 2-2: "5" came first and is correct
            + _rows("b", [0, 0, 0, 0], ["x", None, "y", "y"])
            + _rows("c", [1, 1, 1, 1], ["A", "a", "(A)", None])
            + [{"id": "d", "sample": 0, "correct": None, "score": None, "answer": "q"},  # no ground truth
               {"id": "e", "sample": 0, "error": "OOM", "correct": None, "score": None, "answer": None}])
    rows.reverse()  # sample order comes from the "sample" field, not from file order
    s = summarize_samples(rows)
    assert set(s) == set(SUMMARY_KEYS)
    assert s["samples_per_request"] == 4 and s["requests"] == 3
    assert s["mean_at_k"] == pytest.approx(6 / 12)
    assert s["pass_at_k"] == pytest.approx({"1": 0.5, "2": (5 / 6 + 0 + 1) / 3, "4": 2 / 3})
    assert list(s["pass_at_k"]) == ["1", "2", "4"]
    assert s["maj_at_k"] == pytest.approx(2 / 3)
    assert s["solve_rate_histogram"] == [1, 0, 1, 0, 1]
    assert s["all_same_rate"] == pytest.approx(2 / 3)
    assert s["reward_mean"] == pytest.approx(0.5) and s["reward_std"] == pytest.approx(0.5)


def test_summarize_samples_uneven_counts_use_each_requests_n():
    s = summarize_samples(_rows("x", [1, 0], ["1", "2"]) + _rows("y", [1, 1, 0, 0], ["1", "1", "2", "2"]))
    assert s["samples_per_request"] == 2
    assert s["pass_at_k"] == pytest.approx({"1": 0.5, "2": (1.0 + 5 / 6) / 2})
    assert s["solve_rate_histogram"] == [0, 1, 1, 0, 0]


def test_summarize_samples_reward_spread_and_all_same():
    rows = _rows("a", [0, 0, 1], ["1", "2", "3"], scores=[0.5, 0.5, 1.0]) + _rows("b", [0, 0], ["1", "1"], [0.2, 0.2])
    s = summarize_samples(rows)
    mean = (0.5 + 0.5 + 1.0 + 0.2 + 0.2) / 5
    assert s["reward_mean"] == pytest.approx(mean)
    assert s["reward_std"] == pytest.approx(math.sqrt(sum((x - mean) ** 2 for x in (0.5, 0.5, 1.0, 0.2, 0.2)) / 5))
    assert s["all_same_rate"] == pytest.approx(0.5)  # a's scores differ although no sample of b is correct


def test_summarize_samples_empty():
    s = summarize_samples([{"id": "a", "sample": 0, "correct": None, "score": None}])
    assert s == {"samples_per_request": None, "requests": 0, "mean_at_k": None, "pass_at_k": {}, "maj_at_k": None,
                 "solve_rate_histogram": [], "all_same_rate": None, "reward_mean": None, "reward_std": None,
                 "requests_with_more_samples": None}
    assert summarize_samples([]) == s


def test_majority_vote_ties_and_missing_answers():
    assert majority_correct(_rows("a", [0, 0, 1, 1], [None, "3", "4", "4"]))  # "4" outvotes "3"; None does not vote
    assert not majority_correct(_rows("a", [0, 1, 1], ["b", "a", None]))  # b/a tie: "b" first, and wrong
    assert majority_correct(_rows("a", [0, 1, 1], [None, "a", "b"]))  # the first answer in sample order wins
    # no answer at all (a --reward function judged texts vlmfast reads no answer in): the rows' own verdicts decide
    assert majority_correct(_rows("a", [1, 1], [None, "  "]))
    assert not majority_correct(_rows("a", [0, 0], [None, None]))
    assert not majority_correct(_rows("a", [0, 1], [None, None])) and majority_correct(_rows("a", [1, 0], [None, None]))
    # the voted answer's own samples decide (a reward that weighs the format scores one answer differently)
    assert not majority_correct(_rows("a", [1, 0, 0], ["5", "5", "5"]))
    assert not majority_correct(_rows("a", [0, 1], ["5", "5"]))  # 1 of 2: the first sample decides
    assert majority_correct(_rows("a", [1, 0], ["5", "5"]))


def test_the_vote_reads_each_answer_from_the_text_as_its_score_did():
    """Rows of other tools carry only id, sample and text: their answers vote all the same; a stale
    ``answer`` field is outvoted by the text it was meant to summarize."""
    texts = ["<think>a</think><answer>4</answer>", "<think>b</think><answer> 4 </answer>", "<answer>3</answer>"]
    rows = [{"id": "a", "sample": i, "correct": c, "score": float(c), "text": t}
            for i, (c, t) in enumerate(zip([True, True, False], texts))]
    assert majority_correct(rows)
    assert summarize_samples(rows)["maj_at_k"] == 1.0
    stale = [{**r, "answer": "3"} for r in rows]
    assert majority_correct(stale)
    plain = [{"id": "b", "sample": i, "correct": c, "score": float(c), "text": t}  # a base model, untagged
             for i, (c, t) in enumerate(zip([False, True, True], ["The answer is 7.", "8", "The answer is 8."]))]
    assert majority_correct(plain)


def test_wilson_interval_known_values():
    assert accuracy_interval(5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    assert accuracy_interval(0, 10) == pytest.approx((0.0, 0.2775), abs=1e-4)
    assert accuracy_interval(10, 10) == pytest.approx((0.7225, 1.0), abs=1e-4)
    assert accuracy_interval(0, 3)[0] == 0.0 and accuracy_interval(3, 3)[1] == 1.0
    assert accuracy_interval(81, 263) == pytest.approx((0.2553, 0.3662), abs=1e-4)
    assert accuracy_interval(5, 10, confidence=0.99)[0] < accuracy_interval(5, 10)[0]
    assert accuracy_interval(0, 0) == (None, None)
    for bad in ((11, 10), (-1, 10)):
        with pytest.raises(ValueError):
            accuracy_interval(*bad)
    with pytest.raises(ValueError):
        accuracy_interval(1, 2, confidence=1.0)


def test_identical_sampled_answers_are_news_only_beyond_what_sampling_gives():
    from vlmfast.evaluation.samples import identical_answers_note

    def rows(same_requests, total=10, k=4, tokens=20):
        out = []
        for i in range(total):
            for s in range(k):
                text = "the same long answer" if i < same_requests else f"answer {s}"
                out.append({"id": f"q{i}", "sample": s, "text": text, "n_new_tokens": tokens, "error": None})
        return out

    note = identical_answers_note(rows(10), temperature=1.0)
    assert note is not None and note.startswith("10 of 10 requests got 4+ identical answers")
    assert identical_answers_note(rows(9), temperature=1.0) is None  # 90 %: not beyond the bound
    assert identical_answers_note(rows(10), temperature=0.0) is None  # greedy: identical by design
    assert identical_answers_note(rows(10, tokens=3), temperature=1.0) is None  # short answers repeat by chance
    assert identical_answers_note(rows(4, total=4), temperature=1.0) is None  # too few requests to tell


def test_intervals_with_several_answers_are_over_requests():
    """16 requests × 4 answers, none right: the requests are the trials (0–19.4 %), not the 64 answers
    (0–5.7 %); one answer per request gives the same interval as before. The sweep's checkpoint figures,
    on which collapse_after_peak and reward_without_accuracy are defined, take it."""
    from types import SimpleNamespace

    from vlmfast.evaluation.samples import accuracy_interval, request_interval
    from vlmfast.run.sweep import _Entry
    from vlmfast.run.sweep_figures import step_figures

    assert request_interval([0.0] * 16) == (0.0, pytest.approx(0.1936, abs=1e-4))
    assert accuracy_interval(0, 64)[1] == pytest.approx(0.0566, abs=1e-4)
    assert request_interval([1.0, 0.0, 1.0, 1.0, 0.0]) == accuracy_interval(3, 5)
    low, high = request_interval([0.25] * 16)  # a quarter of each request's answers right
    assert low < 0.25 < high and high - low > accuracy_interval(16, 64)[1] - accuracy_interval(16, 64)[0]
    rows = [{"id": f"q{i}", "sample": k, "text": "x", "error": None, "correct": False, "score": 0.0, "format_ok": False,
             "n_new_tokens": 3, "finish_reason": "eos"} for i in range(16) for k in range(4)]
    figures = step_figures(_Entry(100, "ckpt", "hf-trainer"), "out.jsonl", rows, SimpleNamespace(tokens_per_s=None), "load", 1.0)
    assert (figures["accuracy"], figures["ci_low"], figures["ci_high"]) == (0.0, 0.0, 0.1936)


def test_bench_pairs_requests_not_answers():
    from vlmfast.run.bench import request_means

    rows = [{"id": "a", "sample": 0, "score": 1.0}, {"id": "a", "sample": 1, "score": 0.0},
            {"id": "b", "sample": 0, "score": None}, {"id": "b", "sample": 1, "score": None}]
    assert request_means(rows) == {"a": 0.5, "b": None}


@pytest.mark.parametrize("texts, truth, scorer", [
    (["6", "5", "5.0", "5 apples"], "5", "number"),
    (["B", "(A)", "A. cat", "Option A"], "A", "choice"),
])
def test_majority_vote_counts_answers_that_score_as_one_as_one(texts, truth, scorer):
    """3 of 4 answers say the right number / option, spelled three ways: the majority answer is right."""
    from vlmfast.evaluation.scoring import score_row

    rows = [{"id": "q", "sample": i, "text": f"<answer>{t}</answer>",
             **score_row({"id": "q", "text": f"<answer>{t}</answer>"}, truth, scorer)} for i, t in enumerate(texts)]
    assert [r["correct"] for r in rows] == [False, True, True, True]
    assert majority_correct(rows)


_LONG = ("Looking at the plot, the quantity that keeps decreasing along every step of the optimiser is the gradient "
         "norm of the loss.")


def test_a_long_plain_answer_votes_as_it_scored():
    """`--n 4`, four untagged answers over 64 characters that hold the truth: `contains` scores each right on the
    whole text, so its majority is right (the vote read no answer in them and counted the request wrong)."""
    from vlmfast.evaluation.scoring import score_row

    assert len(_LONG) > 64
    for scorer in ("contains", "exact"):
        truth = "gradient" if scorer == "contains" else _LONG
        rows = [{"id": "free-1", "sample": k, "text": _LONG, **score_row({"id": "free-1", "text": _LONG}, truth, scorer)}
                for k in range(4)]
        assert all(r["correct"] for r in rows)
        assert majority_correct(rows)
        assert summarize_samples(rows)["maj_at_k"] == 1.0 == summarize_samples(rows)["pass_at_k"]["1"]


def test_a_reward_scored_request_with_no_readable_answer_takes_its_rows_verdicts():
    """A `--reward` function judged texts in which vlmfast reads no answer: the request is right when most rows
    are, so four right answers are a right request."""
    rows = [{"id": "r", "sample": k, "text": _LONG, "scorer": "reward:accuracy", "correct": c, "score": float(c)}
            for k, c in enumerate([True, True, True, False])]
    assert majority_correct(rows)
    assert not majority_correct([{**r, "correct": not r["correct"]} for r in rows])


def test_maj_at_k_is_at_least_the_share_of_requests_all_right_and_is_pass_at_1_with_one_answer():
    """Over tagged, short plain, long plain and unreadable answers, by own scorers and a reward: maj@k is never
    below the share of requests whose answers are all right, and with K=1 each request's majority verdict is its
    one answer's."""
    import itertools

    from vlmfast.evaluation.scoring import score_row

    texts = ["<answer>gradient</answer>", "gradient", _LONG, "<think>never closed", "<answer>loss</answer>",
             _LONG.replace("gradient", "weight"), "The answer is gradient."]
    rows = []
    for i, (text, scorer) in enumerate(itertools.product(texts, ("contains", "exact", "auto"))):
        for k in range(3):  # the same text K times, and the text then two others
            t = text if k == 0 or i % 2 else texts[(texts.index(text) + k) % len(texts)]
            rows.append({"id": f"q{i}", "sample": k, "text": t, **score_row({"id": f"q{i}", "text": t}, "gradient", scorer)})
    for k, correct in enumerate([True, True, False, True]):
        rows.append({"id": "rewarded", "sample": k, "text": _LONG, "scorer": "reward:f", "correct": correct,
                     "score": float(correct)})
    groups = {}
    for r in rows:
        groups.setdefault(r["id"], []).append(r)
    all_right = sum(all(r["correct"] for r in g) for g in groups.values()) / len(groups)
    assert all_right > 0 and summarize_samples(rows)["maj_at_k"] >= all_right
    firsts = [r for r in rows if r["sample"] == 0]
    assert [majority_correct([r]) for r in firsts] == [r["correct"] for r in firsts]
    assert summarize_samples(firsts)["maj_at_k"] == summarize_samples(firsts)["pass_at_k"]["1"]
