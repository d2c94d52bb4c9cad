"""A best step that holds up: which of many checkpoints is best, and which cannot be told apart from it.

The highest of 20–50 noisy accuracies is biased upward, and "is step 400 really better than 300?" is one
of many comparisons. From the per-request scores of every step (paired: the same requests), two figures:

- ``p_best``: how often each step has the highest mean score when the requests are resampled — the share
  of bootstrap resamples of the requests (``RESAMPLES``, the same draws for every step, over the requests
  every step scored) in which the step is highest; a tie within a draw splits that draw's share equally.
  Over the steps compared it sums to 1. It is not a calibrated probability that the step is truly the best,
  and it tends to overstate the observed best: resampling reuses the requests that made it the highest (20
  steps of equal true accuracy, 200 requests: the observed best gets 0.36 on average, where each step is the
  best with 1/20).
- ``indistinguishable``: the steps that no paired test shows below another step. Every two steps that share
  requests are compared by the paired test of :func:`vlmfast.evaluation.flags.compare` (the exact McNemar
  test, or with several answers per request the exact sign-flip test) on the requests both scored; each
  comparison is two one-sided hypotheses ("i is not below j", "j is not below i"), the p-value of the one the
  data lean against is half the two-sided one (the null distributions are symmetric) and the other's is taken
  as 1. Holm's step-down procedure (Holm 1979, Scand. J. Statist. 6:65–70) over all k(k − 1) of them controls
  the family-wise error at ``ALPHA`` under any dependence. A step is left out of the set when one of its
  hypotheses is rejected: a truly best step (several, when tied) is left out only by a false rejection, so a
  step outside the set is worse than the best with a family-wise error of at most ``ALPHA``. The observed
  best is never left out (no step is above it).

Pure functions on made data; numpy (always installed beside transformers) draws the resamples.
"""

from __future__ import annotations

ALPHA = 0.05
RESAMPLES = 2000
_CHUNK = 250  # resamples drawn at a time: a chunk × requests count matrix (5,000 requests: 10 MB)


def p_best(scores: dict[int, dict[str, float]], *, resamples: int = RESAMPLES,
           seed: int = 0) -> tuple[dict[int, float], int]:
    """step → share of resamples in which it is highest (see the module docstring), and the number of requests
    every step scored (the ones resampled). ``scores``: step → request id → score in [0, 1]. Empty when
    no request is shared (or no step)."""
    import numpy as np

    steps = sorted(scores)
    shared = sorted(set.intersection(*(set(scores[s]) for s in steps)), key=str) if steps else []
    if not shared:
        return {}, 0
    matrix = np.array([[float(scores[s][rid]) for s in steps] for rid in shared])  # requests × steps
    n, rng = len(shared), np.random.default_rng(seed)
    wins = np.zeros(len(steps))
    left = resamples
    while left:
        size = min(_CHUNK, left)
        counts = rng.multinomial(n, np.full(n, 1.0 / n), size=size)  # how often each request is drawn
        means = counts @ matrix / n  # size × steps
        top = means.max(axis=1, keepdims=True)
        tied = np.isclose(means, top, rtol=0.0, atol=1e-12)
        wins += (tied / tied.sum(axis=1, keepdims=True)).sum(axis=0)
        left -= size
    return {s: float(w / resamples) for s, w in zip(steps, wins)}, n


def holm(p_values: dict, family: int | None = None) -> dict:
    """Holm's step-down adjusted p-values (family-wise error control over the tests given). ``family``: how
    many hypotheses there are in all when more than given; the others count with a p-value of 1."""
    ordered = sorted(p_values.items(), key=lambda item: (item[1], item[0]))
    m, running, out = max(len(ordered), family or 0), 0.0, {}
    for i, (key, p) in enumerate(ordered):
        running = max(running, min(1.0, (m - i) * p))
        out[key] = running
    return out


def pairwise(tables: dict[int, dict]) -> dict[tuple[int, int], float]:
    """(lower, higher) → the one-sided p-value that step ``lower`` is below step ``higher``, for every two steps
    of ``tables`` (step → :func:`vlmfast.evaluation.flags.per_request` table) that share a scored request;
    ``lower`` has the lower mean score over the requests both scored (equal means: p 1). The p-value is half
    the two-sided one of :func:`vlmfast.evaluation.stats.paired_p`, 1 where that is 1."""
    import numpy as np

    from vlmfast.evaluation.stats import paired_p

    steps = sorted(tables)
    ids = sorted({rid for t in tables.values() for rid in t}, key=str)
    matrix, at = np.full((len(ids), len(steps)), np.nan), {rid: i for i, rid in enumerate(ids)}
    for j, step in enumerate(steps):
        for rid, row in tables[step].items():
            matrix[at[rid], j] = row[0]
    out = {}
    for j, first in enumerate(steps):
        for k in range(j + 1, len(steps)):
            both = ~np.isnan(matrix[:, j]) & ~np.isnan(matrix[:, k])
            if not both.any():
                continue
            x, y = matrix[both, j], matrix[both, k]
            p = paired_p(x, y)
            difference = float((x - y).sum())
            lower, higher = (first, steps[k]) if difference < 0 else (steps[k], first)
            out[(lower, higher)] = p / 2 if p < 1 and difference else 1.0
    return out


def indistinguishable(best: int, steps: list[int], pairs: dict[tuple[int, int], float], *,
                      alpha: float = ALPHA) -> tuple[list[int], dict[int, float]]:
    """The steps no paired test shows below another (see the module docstring): ``pairs`` as
    :func:`pairwise` gives them, Holm-adjusted over twice their number (both one-sided hypotheses of each
    pair). Returns the set (sorted; ``best`` always in it, and every step of ``steps`` with no pair) and, per
    step of ``steps`` but ``best``, its ``holm_p``: the smallest adjusted p-value of its being below another
    step (1.0 when it is above or level with every step it was compared with)."""
    adjusted = holm(pairs, family=2 * len(pairs))
    below = {s: 1.0 for s in steps if s != best}
    for (lower, _), p in adjusted.items():
        if lower in below:
            below[lower] = min(below[lower], p)
    keep = [best] + [s for s, p in below.items() if p >= alpha]
    return sorted(keep), below


def best_step(scores: dict[int, dict[str, float]], best: int, pairs: dict[tuple[int, int], float], *,
              resamples: int = RESAMPLES, seed: int = 0, alpha: float = ALPHA) -> dict:
    """Both figures for a sweep of the steps of ``scores`` (step → request id → score): ``p_best`` (step →
    share of resamples in which it is highest, 4 decimals), ``requests`` resampled, ``indistinguishable``
    (steps), ``holm_p`` (step → smallest Holm-adjusted p-value of its being below another step, 4 significant
    digits; :func:`indistinguishable`), ``comparisons`` (the one-sided hypotheses Holm corrects over),
    ``alpha`` and ``resamples``. ``pairs``: :func:`pairwise`."""
    probabilities, n = p_best(scores, resamples=resamples, seed=seed)
    keep, adjusted = indistinguishable(best, sorted(scores), pairs, alpha=alpha)
    return {"p_best": {s: round(p, 4) for s, p in probabilities.items()}, "requests": n,
            "indistinguishable": keep, "holm_p": {s: float(f"{p:.4g}") for s, p in adjusted.items()},
            "comparisons": 2 * len(pairs), "alpha": alpha, "resamples": resamples}


def held_up(best: dict | None, ranked: list[dict], tables: dict[int, dict]) -> dict | None:
    """Whether the best holds up (see the module docstring): each ranked step's share of resamples in which
    it is highest, and the steps no paired test, Holm-corrected over every two steps, shows below another.
    Each checkpoint's figures get ``p_best``, ``holm_p`` (None for the best) and ``near_best`` (in that set)."""
    if best is None:
        return None
    scores = {f["step"]: {rid: v[0] for rid, v in tables[f["step"]].items()} for f in ranked}
    held = best_step(scores, best["step"], pairwise({f["step"]: tables[f["step"]] for f in ranked}))
    for f in ranked:
        f["p_best"] = held["p_best"].get(f["step"])
        f["holm_p"] = held["holm_p"].get(f["step"])
        f["near_best"] = f["step"] in held["indistinguishable"]
    return held


def undistinguished_note(best: dict | None, figures: list[dict], held: dict | None) -> list[str]:
    """A note when other steps are in the set with the best (the same test as the collapse flag): none of
    them is shown below another step. Where some differ from the best's accuracy, it adds that more requests
    may tell those apart (not said of steps that tie it exactly)."""
    if best is None or held is None:
        return []
    tied = [s for s in held["indistinguishable"] if s != best["step"]]
    if not tied:
        return []
    label = "base" if best["label"] == "base" else f"step {best['step']}"
    by_step = {f["step"]: f for f in figures}
    named = [("base" if by_step.get(s, {}).get("label") == "base" else f"step {s}") for s in tied]
    differ = [s for s in tied if by_step.get(s, {}).get("accuracy") != best.get("accuracy")]
    more = (" (more evaluation rows may tell apart those whose accuracy differs from the best's)" if differ
            else " (they score the same accuracy)")
    return [f"the best ({label}; highest in {held['p_best'].get(best['step'], 0):.0%} of request resamples) is not "
            f"distinguishable from {', '.join(named)}: no paired test shows them below another step (Holm-corrected "
            f"over {held['comparisons']} one-sided comparisons, alpha {held['alpha']}){more}"]


def unscored_note(figures: list[dict]) -> list[str]:
    """Accuracy counts the answers with ground truth only: said (one step's counts) when some answers of a
    checkpoint had none, so a sweep's accuracies are not read as over every request."""
    partial = next((f for f in figures if 0 < (f.get("scored") or 0) < f["rows"] - f["errors"]), None)
    if partial is None:
        return []
    answered = partial["rows"] - partial["errors"]
    return [f"accuracy is over the answers with ground truth: {partial['scored']} of {answered} at step "
            f"{partial['step']} ({answered - partial['scored']} have none in the manifest)"]
