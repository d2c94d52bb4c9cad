"""Figures over scored rows: accuracy and format rate of a run (:func:`summarize`), and whether one
run is more accurate than another (:func:`paired_comparison`: paired differences over shared ids, Newcombe's
hybrid score interval, the exact McNemar or sign-flip test). The standard library and numpy only (no model, no torch import), so
``vlmfast score`` and ``bench`` reach it without a model."""

from __future__ import annotations

import math
from fractions import Fraction
from statistics import NormalDist

from vlmfast.errors import UsageError
from vlmfast.evaluation.scoring import parse_reasoning


# A reward's sub-score that says whether the answer is right (EasyR1 "accuracy", verl "acc"): when a reward
# returns one, it decides a row's correctness, not the total that also weights the format.
ACCURACY_SUBSCORES = ("accuracy", "acc")


def accuracy_key(subscores) -> str | None:
    """The key of ``subscores`` (a row's ``reward_scores``) that is its accuracy: ``accuracy`` or ``acc``,
    bare or after a function's name (``math/accuracy``); None when there is none, or several."""
    if not isinstance(subscores, dict):
        return None
    keys = [k for k in subscores if str(k).rpartition("/")[2] in ACCURACY_SUBSCORES]
    return keys[0] if len(keys) == 1 else None


def mean(values) -> float | None:
    """The arithmetic mean of ``values`` (any iterable of numbers), or None when there are none."""
    values = [float(v) for v in values]
    return sum(values) / len(values) if values else None


def summarize(rows: list[dict]) -> dict:
    """Accuracy, format rate and answer lengths over scored rows, overall and per scorer; with several
    answers per request (rows carry ``sample``) also ``samples`` (:func:`vlmfast.evaluation.samples.summarize_samples`).

    ``format_rate`` and the mean lengths are over successful rows (lengths over rows whose ``text``
    has the part); accuracy and scores over rows with ground truth. Nothing to average → null."""
    ok = [r for r in rows if r.get("error") is None]
    scored = [r for r in ok if r.get("score") is not None]
    parts = [parse_reasoning(r["text"]) for r in ok if isinstance(r.get("text"), str)]
    tagged = [r for r in scored if isinstance(r.get("text"), str) and parse_reasoning(r["text"])[1] is not None]
    summary = {
        **_score_stats(scored),
        # accuracy over rows that answered inside <answer> tags, beside the overall (untagged rows are scored
        # on the answer they state, if any)
        "tagged_accuracy": mean(bool(r["correct"]) for r in tagged if r.get("correct") is not None),
        "tagged_rows": len(tagged),
        "format_rate": mean(bool(r["format_ok"]) for r in ok if r.get("format_ok") is not None),
        "mean_think_chars": mean(len(think) for think, _ in parts if think is not None),
        "mean_answer_chars": mean(len(answer) for _, answer in parts if answer is not None),
        "bbox_unmapped": sum(1 for r in scored if r.get("bbox_unmapped")),
        # rows whose reward function raised (--skip-bad): unscored, so left out of the accuracy above
        "reward_errors": sum(1 for r in ok if r.get("reward_error") is not None),
        "error_rows": len(rows) - len(ok),  # the run failed on their input (--skip-bad): no answer, no score
    }
    from vlmfast.evaluation.health import health

    summary["health"] = health(rows)  # the answers' shape: length, truncation, answer blocks, repetition
    names = sorted({r["scorer"] for r in scored if r.get("scorer")})
    summary["by_scorer"] = {n: _score_stats([r for r in scored if r.get("scorer") == n]) for n in names}
    if any(isinstance(r.get("rewards"), dict) for r in ok):  # --reward: each function beside the total
        summary["rewards"] = reward_means(ok)
    if any(r.get("sample") is not None for r in rows):  # n answers per request: pass@k, maj@k, solve rates
        from vlmfast.evaluation.samples import summarize_samples

        summary["samples"] = summarize_samples(rows)
    return summary


def reward_means(rows: list[dict]) -> dict:
    """Per reward function (the rows' ``rewards``): its mean over the rows it rewarded, and how many rows it
    called not applicable (None, left out of its mean as TRL's nanmean leaves them). ``not_applicable_rows``
    beside them counts the rows every function left out (no score)."""
    names = list(dict.fromkeys(n for r in rows if isinstance(r.get("rewards"), dict) for n in r["rewards"]))
    given = [r["rewards"] for r in rows if isinstance(r.get("rewards"), dict)]
    out = {n: {"mean": mean(g[n] for g in given if g.get(n) is not None),
               "not_applicable_rows": sum(1 for g in given if g.get(n) is None)} for n in names}
    subs = [r["reward_scores"] for r in rows if isinstance(r.get("reward_scores"), dict)]
    keys = list(dict.fromkeys(k for g in subs for k in g))
    means = {"functions": out, "not_applicable_rows": sum(1 for g in given if all(v is None for v in g.values()))}
    if keys:
        correct_from = {accuracy_key(g) for g in subs} - {None}
        # each sub-score's mean over the rows that returned it (EasyR1's format / accuracy, …), and the one a
        # row's correctness was read from (None: the total against the threshold)
        means.update(subscores={k: mean(g[k] for g in subs if isinstance(g.get(k), (int, float))) for k in keys},
                     correct_from=sorted(correct_from)[0] if len(correct_from) == 1 else None)
    return means


def by_value(rows: list[dict], values: dict[str, object], column: str) -> dict:
    """Accuracy per value of a manifest column (``values``: id → the record's value; VLMEvalKit's
    ``category``, a dataset's ``data_source``): each group's figures as :func:`summarize` gives them per
    scorer, over the rows scored, groups in order of size. A list value (several categories) puts the
    row in each; ``rows_without_value`` counts the rows whose record has none (in no group)."""
    groups: dict[str, list[dict]] = {}
    missing = 0
    for row in rows:
        value = values.get(str(row.get("id")))
        names = [_group_name(v) for v in (value if isinstance(value, list) else [value]) if v is not None and v != ""]
        missing += not names
        for name in dict.fromkeys(names):
            groups.setdefault(name, []).append(row)
    scored = {name: [r for r in members if r.get("error") is None and r.get("score") is not None]
              for name, members in groups.items()}
    order = sorted(groups, key=lambda name: (-len(scored[name]), name))
    return {"column": column, "rows_without_value": missing,
            "groups": {name: {"rows": len(groups[name]), "requests": len({str(r.get("id")) for r in groups[name]}),
                              **_score_stats(scored[name])} for name in order}}


def group_accuracy(rows: list[dict], values: dict[str, object], column: str) -> dict:
    """What a sweep reports per ``--by`` group of one step: requests, scored answers, accuracy."""
    return {name: {"requests": g["requests"], "scored": g["scored"], "accuracy": g["accuracy"]}
            for name, g in by_value(rows, values, column)["groups"].items()}


def _group_name(value) -> str:
    import json

    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, sort_keys=True)


def _score_stats(scored: list[dict]) -> dict:
    return {
        "scored": len(scored),
        "accuracy": mean(bool(r["correct"]) for r in scored if r.get("correct") is not None),  # None: not judged
        "mean_score": mean(r["score"] for r in scored),
        "answer_parse_failures": sum(1 for r in scored if r.get("parse_failed")),
    }


def paired_comparison(a: dict, b: dict, *, confidence: float = 0.95) -> dict:
    """Compare two runs (e.g. checkpoint ``a`` vs base ``b``) on the ids both scored; each id's score is in
    [0, 1] (0/1, or the mean of its answers with ``--n``).

    ``difference`` is mean(a) − mean(b), with Newcombe's hybrid score interval (:func:`_paired_score_interval`:
    for 0/1 scores Newcombe 1998 method 10 itself, for means of several answers the same method on the means),
    and ``p_value`` is the paired test of :func:`paired_p` (the exact McNemar test on the discordant ids for
    0/1 scores, else the exact sign-flip test on the differences). The two are different methods and can
    disagree near the 5 % line: with few discordant ids the interval may leave out 0 while p ≥ 0.05 (5 up, 0
    down, 600 right in both and 395 in neither of 1,000: [0.0002, 0.0099], p 0.0625; with none right in both,
    one margin of the table is empty and the interval is [0.0002, 0.0117]), or hold 0 while p < 0.05. Ids
    whose score is None on either side are left out."""
    if not 0 < confidence < 1:
        raise UsageError("bad interval settings", hint="confidence must be between 0 and 1")
    ids = sorted((k for k in a.keys() & b.keys() if a[k] is not None and b[k] is not None), key=str)
    xs, ys = [float(a[k]) for k in ids], [float(b[k]) for k in ids]
    n = len(ids)
    result = {"n": n, "accuracy_a": mean(xs), "accuracy_b": mean(ys), "difference": None, "ci_low": None,
              "ci_high": None, "confidence": confidence, "p_value": None, "discordant": None}
    if n == 0:
        return result
    result["discordant"] = {"a_better": sum(x > y for x, y in zip(xs, ys)), "b_better": sum(y > x for x, y in zip(xs, ys))}
    result["difference"] = sum(x - y for x, y in zip(xs, ys)) / n
    result["ci_low"], result["ci_high"] = _paired_score_interval(xs, ys, confidence)
    result["p_value"] = paired_p(xs, ys)
    return result


def _paired_score_interval(xs: list[float], ys: list[float], confidence: float) -> tuple[float, float]:
    """Newcombe's hybrid score interval for the difference of two paired means of values in [0, 1] (Newcombe
    1998, "Improved confidence intervals for the difference between binomial proportions based on paired
    data", Stat. Med. 17:2635–2650, method 10, with the continuity-corrected phi). Each side's mean gets its
    Wilson score interval over the n pairs, and the two are combined with the correlation of the pairs (the
    square-and-add of Zou & Donner 2008, "Construction of confidence limits about effect measures", Stat. Med.
    27:1693–1702, which method 10 is an instance of).

    For 0/1 scores this is method 10 exactly: the correlation of the pairs is phi of the 2×2 table (a right in
    both, b only in the first, c only in the second, d in neither), and its continuity correction, ad − bc
    less n/2, is the sum of the cross products Σ(x − x̄)(y − ȳ) = (ad − bc)/n less ½; phi is 0 when a margin is
    empty. Unlike an interval conditional on the discordant ids, it is not held within ±(b + c) / n: with
    nothing discordant it still has the width n requests allow (3 of 3 right in both: ±0.56). Simulated
    coverage of the 95 % interval: 0.94–0.97 from 30 to 1,000 requests, 0.90 at the hard corner of 50 requests
    with 4 % flipping one way and none the other (the interval conditional on the discordant ids it replaces:
    0.56–0.98).

    For means of K answers (``--n``) the same formula takes the means, the Pearson correlation of the pairs and
    the same correction of ½ on the cross products. Wilson's variance p(1 − p)/n bounds that of a mean of values
    in [0, 1] with mean p, so each side's interval keeps its coverage (as
    :func:`vlmfast.evaluation.samples.request_interval`'s does), and two steps that agree on every request, or
    differ on one, keep an interval of about the width one answer per request gives, never a point (a
    percentile bootstrap of the differences gives [0, 0] when they are all 0, and a bound of exactly 0 when they
    are all of one sign). Two steps that agree on all 20 requests: ±9.0 points with one answer each (10 right
    in both); ±14.0 with 4 answers each whose means have a standard deviation of 0.32 around 0.45 (means that
    vary less across requests than 0/1 scores do leave more weight to the correction). The bound makes it
    conservative: simulated coverage of the 95 % interval with K = 4 (requests drawn from a population, each
    one's chance of a right answer from a Beta distribution, the two steps drawn independently; 20–500
    requests) is 0.97–1.00 where the steps are the same model or differ by a shift or a power of that chance,
    0.90–1.00 at the hard corner above (the same as K = 1 there); and it narrows as K grows (the same model
    on 200 requests: ±8.0 points with K = 1, ±5.8 with K = 4, ±3.6 with K = 16)."""
    n = len(xs)
    z = NormalDist().inv_cdf(0.5 + confidence / 2)

    def wilson(k: float) -> tuple[float, float]:
        share, spread = k / n, z * math.sqrt(max(k * (n - k) / n, 0.0) + z * z / 4) / n
        centre, scale = (k + z * z / 2) / n, 1 + z * z / n
        low, high = (centre - spread) / scale, (centre + spread) / scale
        return min(low, share), max(high, share)  # rounding never puts the share outside its own interval

    p1, p2 = sum(xs) / n, sum(ys) / n
    (l1, u1), (l2, u2) = wilson(sum(xs)), wilson(sum(ys))
    sxx = sum((x - p1) ** 2 for x in xs)
    syy = sum((y - p2) ** 2 for y in ys)
    sxy = sum((x - p1) * (y - p2) for x, y in zip(xs, ys))
    sxy = max(sxy - 0.5, 0.0) if sxy > 0 else sxy  # the continuity correction of phi
    phi = sxy / math.sqrt(sxx * syy) if sxx * syy > 0 else 0.0
    phi = min(max(phi, -1.0), 1.0)
    below = (p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2
    above = (u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2
    difference = p1 - p2
    return max(-1.0, difference - math.sqrt(max(below, 0.0))), min(1.0, difference + math.sqrt(max(above, 0.0)))


def mcnemar_exact(a_only: int, b_only: int) -> float:
    """Exact two-sided McNemar p-value: binomial(n = discordant pairs, p = ½), doubled tail, capped at 1. Up to
    ``EXACT_PAIRS`` discordant pairs in exact integer arithmetic; beyond, the same sum of binomial terms in
    floating point on the log scale (relative error far below the 4 significant digits reported), so a sweep
    comparing every two of 50 steps over thousands of requests takes milliseconds per pair."""
    n = a_only + b_only
    if n == 0:
        return 1.0
    low = min(a_only, b_only)
    if n > EXACT_PAIRS:
        import numpy as np

        j = np.arange(low, dtype=float)
        logs = np.concatenate(([0.0], np.cumsum(np.log(n - j) - np.log(j + 1))))  # log C(n, 0) … log C(n, low)
        top = logs.max()
        return min(1.0, math.exp(top + math.log(np.exp(logs - top).sum()) + (1 - n) * math.log(2)))
    tail, term = 0, 1  # C(n, 0) + … + C(n, k), each term from the last
    for k in range(low + 1):
        tail += term
        term = term * (n - k) // (k + 1)
    # Exact rational arithmetic: 0.5 ** n underflows long before n gets large.
    return min(1.0, float(Fraction(2 * tail, 2 ** n)))


EXACT_PAIRS = 400


def sign_flip_exact(diffs: list[float], *, max_denominator: int = 4096, max_work: int = 30_000_000) -> float:
    """Two-sided p-value of the paired sign-flip (randomization) test of mean(diffs) = 0: under the null each
    request's difference is as likely with either sign, and the p-value is the share of the 2^n sign
    assignments whose |sum| is at least the observed one. Differences of 0/1 scores make it exactly the
    McNemar test (:func:`mcnemar_exact`); differences of per-request means over K answers (c/K) keep the
    test on the figure the sweep ranks steps by. The differences are read as fractions with a denominator
    up to ``max_denominator`` (answer counts); the null distribution of the sum is a convolution of scaled
    binomials, exact unless that convolution costs more than ``max_work`` (thousands of requests with many
    distinct differences): then its normal approximation (variance Σd², continuity-corrected)."""
    import math

    fractions = [Fraction(d).limit_denominator(max_denominator) for d in diffs]
    scale = 1
    for f in fractions:
        scale = math.lcm(scale, f.denominator)
    scaled = [int(f * scale) for f in fractions]
    observed = abs(sum(scaled))
    counts: dict[int, int] = {}
    for v in scaled:
        if v:
            counts[abs(v)] = counts.get(abs(v), 0) + 1
    if not counts or observed == 0:
        return 1.0
    total = sum(v * c for v, c in counts.items())
    # the sum is 2·T − total with T = Σ v·B_v, B_v ~ Binomial(c_v, ½): T's distribution on 0…total
    work, size = 0, 1
    for v, c in counts.items():
        size += v * c
        work += size * (v * c + 1)
    if work > max_work:
        variance = sum(v * v * c for v, c in counts.items())
        z = (observed - 1) / math.sqrt(variance)  # sums move in steps of 2: half a step of continuity
        return min(1.0, math.erfc(max(z, 0.0) / math.sqrt(2)))
    import numpy as np

    dist = np.ones(1)
    for v, c in counts.items():
        part = np.zeros(v * c + 1)
        part[::v] = [math.exp(math.lgamma(c + 1) - math.lgamma(b + 1) - math.lgamma(c - b + 1) - c * math.log(2))
                     for b in range(c + 1)]
        dist = np.convolve(dist, part)
    sums = 2 * np.arange(len(dist)) - total
    return float(min(1.0, dist[np.abs(sums) >= observed].sum()))


def paired_p(a_scores, b_scores) -> float:
    """Two-sided p-value of the paired test that two checkpoints' per-request scores (sequences in the same
    request order) have equal means: the exact McNemar test on the requests that differ when every score is
    0 or 1 (:func:`vlmfast.evaluation.stats.mcnemar_exact`), else the exact sign-flip test on the differences
    (:func:`vlmfast.evaluation.stats.sign_flip_exact`)."""
    import numpy as np

    x, y = np.asarray(a_scores, dtype=float), np.asarray(b_scores, dtype=float)
    if np.isin(x, (0.0, 1.0)).all() and np.isin(y, (0.0, 1.0)).all():
        return mcnemar_exact(int((x > y).sum()), int((y > x).sum()))
    return sign_flip_exact((x - y).tolist())
