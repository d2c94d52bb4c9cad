"""Metrics over n sampled answers per request: pass@k, maj@k, solve rates, reward spread.

Pure functions on scored result rows (standard library only). A row carries its request ``id``, its
``sample`` index 0…K−1, its ``text`` and the scoring fields ``score`` and ``correct``; rows without
ground truth (``correct`` None) are left out of every figure.
"""

from __future__ import annotations

import math
from collections import defaultdict
from statistics import NormalDist

from vlmfast.evaluation.scoring import normalize, scored_answer

SUMMARY_KEYS = ("samples_per_request", "requests", "mean_at_k", "pass_at_k", "maj_at_k", "solve_rate_histogram",
                "all_same_rate", "reward_mean", "reward_std", "requests_with_more_samples")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one request with ``n`` samples of which ``c`` are correct:
    1 − C(n−c, k) / C(n, k), the chance that k samples drawn without replacement hold a correct one.

    Computed as 1 − ∏_{i=n−c+1}^{n} (1 − k/i), which never forms the huge binomials; 1.0 when
    n − c < k (every draw of k holds a correct sample). ValueError for k outside 1…n or c outside 0…n."""
    if not 1 <= k <= n:
        raise ValueError(f"k must be between 1 and n={n}, got {k}")
    if not 0 <= c <= n:
        raise ValueError(f"c must be between 0 and n={n}, got {c}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def ks_for(n: int) -> list[int]:
    """The k reported for n samples: 1, the powers of two below n, and n (sorted, unique)."""
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    ks = {n}
    k = 1
    while k < n:
        ks.add(k)
        k *= 2
    return sorted(ks)


def _requests(rows: list[dict]) -> dict[str, list[dict]]:
    """id → that request's scored rows in sample order (first appearance order of ids kept)."""
    groups: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        if row.get("correct") is not None:
            groups[str(row.get("id"))].append(row)
    for samples in groups.values():
        samples.sort(key=lambda r: r.get("sample") or 0)
    return dict(groups)


def majority_correct(samples: list[dict]) -> bool:
    """Whether the majority answer of one request's samples (in sample order) is correct.

    A row votes with the answer its score was given for, read from its ``text`` by its ``scorer``
    (:func:`~vlmfast.evaluation.scoring.scored_answer`: the ``<answer>`` part, what an untagged text states, the
    whole untagged text for ``exact``/``contains``; results from other tools carry no ``answer`` field, or their
    own); a row without text votes with its ``answer`` field. Answers vote after
    :func:`~vlmfast.evaluation.scoring.normalize`; rows without an answer do not vote. A tie goes to the answer
    that appeared first in sample order. The voted answer is correct when most of its samples are (its first
    sample decides a tie): one normalized answer can score differently when the score also weighs the format.
    When no row has an answer (a ``--reward`` function judged texts with none vlmfast can read), the request is
    right when most of its rows are (the first sample decides a tie): a request whose answers are all right is
    never counted wrong, and one answer is right by the majority exactly when it is right."""
    votes: dict[str, list[dict]] = {}
    for row in samples:
        text = row.get("text")
        answer = scored_answer(text, row.get("scorer"), row.get("prompt")) if isinstance(text, str) else row.get("answer")
        if isinstance(answer, str) and (key := _vote_key(answer, row.get("scorer"))):
            votes.setdefault(key, []).append(row)
    # max() keeps the first of equal counts, and dicts keep first-appearance order: ties go to the earliest.
    voted = max(votes.values(), key=len) if votes else samples
    if not voted:
        return False
    right = sum(1 for r in voted if r["correct"])
    return right * 2 > len(voted) or (right * 2 == len(voted) and bool(voted[0]["correct"]))


def _vote_key(answer: str, scorer) -> str:
    """What an answer votes for: the option letter (``choice``) or the number (``number``) its scorer reads, so
    "(B)", "B. text" and "Option B", or "5", "5.0" and "5 apples", are one answer as they score as one; else its
    normalized text."""
    from vlmfast.evaluation.scoring import parse_choice, parse_number

    if scorer == "choice" and (letter := parse_choice(answer)) is not None:
        return f"choice:{letter}"
    if scorer == "number" and (number := parse_number(answer)) is not None:
        return f"number:{number[0]!r}:{number[1]}"
    return normalize(answer)


def summarize_samples(rows: list[dict]) -> dict:
    """Figures over n samples per request (rows with ground truth only), grouped by ``id``.

    ``samples_per_request``: K (the smallest count if requests differ; pass@k then uses each request's
    own n, for k up to that smallest K). ``mean_at_k``: accuracy over all samples. ``pass_at_k``:
    {"1": …, "2": …, …, "K": …} unbiased pass@k averaged over requests. ``maj_at_k``: share of requests
    whose majority answer is correct (:func:`majority_correct`). ``solve_rate_histogram[c]``: requests
    with exactly c correct samples (length: the largest count + 1). ``all_same_rate``: share of requests
    whose samples all got the same score (GRPO learns nothing from them: zero advantage).
    ``reward_mean`` / ``reward_std``: mean and population std of every sample's ``score``.
    No scored rows → the same keys with None, 0 or empty values."""
    groups = _requests(rows)
    if not groups:
        return {**dict.fromkeys(SUMMARY_KEYS), "requests": 0, "pass_at_k": {}, "solve_rate_histogram": []}
    counts = [len(s) for s in groups.values()]
    k_max = min(counts)
    correct = [sum(1 for r in s if r["correct"]) for s in groups.values()]
    scores = [float(r["score"]) for s in groups.values() for r in s if r.get("score") is not None]
    histogram = [0] * (max(counts) + 1)
    for c in correct:
        histogram[c] += 1
    reward_mean = sum(scores) / len(scores) if scores else None
    return {
        "samples_per_request": k_max,
        "requests": len(groups),
        "requests_with_more_samples": sum(1 for n in counts if n > k_max),  # uneven: a run cut short mid-request
        "mean_at_k": sum(correct) / sum(counts),
        "pass_at_k": {str(k): _mean(pass_at_k(n, c, k) for n, c in zip(counts, correct)) for k in ks_for(k_max)},
        "maj_at_k": _mean(float(majority_correct(s)) for s in groups.values()),
        "solve_rate_histogram": histogram,
        "all_same_rate": _mean(float(len({r.get("score") for r in s}) == 1) for s in groups.values()),
        "reward_mean": reward_mean,
        "reward_std": math.sqrt(sum((x - reward_mean) ** 2 for x in scores) / len(scores)) if scores else None,
    }


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values)


def accuracy_interval(correct: int, n: int, confidence: float = 0.95) -> tuple[float | None, float | None]:
    """Wilson score interval for an accuracy of ``correct`` out of ``n``; (None, None) when n is 0.

    Wilson rather than the normal approximation p ± z·√(p(1−p)/n): on the small eval sets and the
    accuracies near 0 or 1 that checkpoint sweeps produce, the normal interval collapses to a point
    (0/20 → [0, 0]) or leaves [0, 1]; Wilson's stays inside [0, 1] and keeps its coverage."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be between 0 and 1, got {confidence}")
    if not 0 <= correct <= n:
        raise ValueError(f"correct must be between 0 and n={n}, got {correct}")
    if n == 0:
        return None, None
    return _wilson(correct / n, n, confidence)


def request_interval(scores: list[float], confidence: float = 0.95) -> tuple[float | None, float | None]:
    """The accuracy interval over requests, ``scores`` holding each request's mean correctness over its
    answers (:func:`vlmfast.evaluation.flags.per_request`): the requests are the independent trials, not
    the answers (16 requests × 4 answers, none right: 0–19.4 %, not the 0–5.7 % of 64 trials). Wilson's
    interval at the requests' mean with n = the requests: a mean of values in [0, 1] varies at most as a
    0/1 one of the same mean does, so the interval keeps its coverage; with one answer per request it is
    :func:`accuracy_interval` itself."""
    if not scores:
        return None, None
    return _wilson(sum(scores) / len(scores), len(scores), confidence)


def _wilson(p: float, n: int, confidence: float) -> tuple[float, float]:
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be between 0 and 1, got {confidence}")
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    # The bounds at 0 and 1 are exactly 0 and 1; the subtraction leaves rounding dust there.
    low = 0.0 if p <= 0 else max(0.0, centre - half)
    high = 1.0 if p >= 1 else min(1.0, centre + half)
    return low, high


IDENTICAL_SHARE = 0.9  # of the requests with long answers: more than this with K identical answers is news
IDENTICAL_MIN_TOKENS = 16  # answers this long rarely repeat word for word when sampled
IDENTICAL_MIN_TEMPERATURE = 0.3
IDENTICAL_MIN_REQUESTS = 5


def identical_answers_note(rows: list[dict], temperature: float) -> str | None:
    """A note when the K sampled answers of a request are the same text more often than sampling allows:
    at a temperature of ``IDENTICAL_MIN_TEMPERATURE`` or more, over the requests (at least
    ``IDENTICAL_MIN_REQUESTS``) whose answers all run ``IDENTICAL_MIN_TOKENS`` tokens or more, more than
    ``IDENTICAL_SHARE`` of them have K identical answers — what an engine that ignored the sampling settings
    (one seed for every answer, a deterministic mode) gives. pass@k over such answers is pass@1."""
    groups: dict[str, list[dict]] = {}
    for row in rows:
        if row.get("error") is None and row.get("sample") is not None and isinstance(row.get("text"), str):
            groups.setdefault(str(row["id"]), []).append(row)
    long = [g for g in groups.values() if len(g) > 1 and min(r.get("n_new_tokens") or 0 for r in g) >= IDENTICAL_MIN_TOKENS]
    if temperature < IDENTICAL_MIN_TEMPERATURE or len(long) < IDENTICAL_MIN_REQUESTS:
        return None
    same = sum(len({r["text"] for r in g}) == 1 for g in long)
    if same <= IDENTICAL_SHARE * len(long):
        return None
    k = min(len(g) for g in long)
    return (f"{same} of {len(long)} requests got {k}+ identical answers of {IDENTICAL_MIN_TOKENS}+ tokens at temperature "
            f"{temperature:g}: more than sampling gives; check that the engine sampled each answer (its own seed, no "
            "deterministic mode) — pass@k over identical answers is pass@1")
