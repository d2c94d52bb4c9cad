"""A best step that holds up: which of many checkpoints is best, and which cannot be told apart from it.

The highest of 20–50 noisy accuracies is biased upward, and "is step 400 really better than 300?" is one
of many comparisons. From the per-request scores of every step (paired: the same requests), two figures:

- ``p_best``: the probability that each step is the best — the share of bootstrap resamples of the
  requests (``RESAMPLES``, the same draws for every step, over the requests every step scored) in which
  the step has the highest mean score; a tie within a draw splits that draw's share equally. Over the
  steps compared it sums to 1.
- ``indistinguishable``: the best step and every step whose paired test against it (the exact McNemar
  test of :func:`vlmfast.evaluation.flags.compare`, on the requests both scored) is not significant at
  ``ALPHA`` after Holm's correction for the number of steps compared with the best. Steps outside the
  set are worse than the best with a family-wise error rate of at most ``ALPHA``.

Pure functions on made data; numpy (always installed beside transformers) draws the resamples.
"""

from __future__ import annotations

ALPHA = 0.05
RESAMPLES = 2000
_CHUNK = 250  # resamples drawn at a time: a chunk × requests count matrix (5,000 requests: 10 MB)


def p_best(scores: dict[int, dict[str, float]], *, resamples: int = RESAMPLES,
           seed: int = 0) -> tuple[dict[int, float], int]:
    """step → probability that it is the best (see the module docstring), and the number of requests
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


def holm(p_values: dict[int, float]) -> dict[int, float]:
    """Holm's step-down adjusted p-values (family-wise error control over the tests given)."""
    ordered = sorted(p_values.items(), key=lambda item: (item[1], item[0]))
    m, running, out = len(ordered), 0.0, {}
    for i, (key, p) in enumerate(ordered):
        running = max(running, min(1.0, (m - i) * p))
        out[key] = running
    return out


def indistinguishable(best: int, p_values: dict[int, float | None], *,
                      alpha: float = ALPHA) -> tuple[list[int], dict[int, float]]:
    """The best step and those not told apart from it: ``p_values`` are each other step's paired test
    against the best (None: no shared request, so not told apart). Returns the set (sorted) and the
    Holm-adjusted p-values."""
    tested = {s: p for s, p in p_values.items() if p is not None and s != best}
    adjusted = holm(tested)
    keep = [best] + [s for s, p in p_values.items() if s != best and (p is None or adjusted[s] >= alpha)]
    return sorted(keep), adjusted


def best_step(scores: dict[int, dict[str, float]], best: int, p_values: dict[int, float | None], *,
              resamples: int = RESAMPLES, seed: int = 0, alpha: float = ALPHA) -> dict:
    """Both figures for a sweep: ``p_best`` (step → probability, 4 decimals), ``requests`` resampled,
    ``indistinguishable`` (steps), ``holm_p`` (step → adjusted p-value against ``best``, 4 significant
    digits), ``alpha`` and ``resamples``."""
    probabilities, n = p_best(scores, resamples=resamples, seed=seed)
    keep, adjusted = indistinguishable(best, p_values, alpha=alpha)
    return {"p_best": {s: round(p, 4) for s, p in probabilities.items()}, "requests": n,
            "indistinguishable": keep, "holm_p": {s: float(f"{p:.4g}") for s, p in adjusted.items()},
            "alpha": alpha, "resamples": resamples}


def held_up(best: dict | None, ranked: list[dict], tables: dict[int, dict]) -> dict | None:
    """Whether the best holds up (:mod:`vlmfast.evaluation.best`): each ranked step's probability of being
    the best, and the steps its paired test, Holm-corrected, does not tell apart from it. Each checkpoint's
    figures get ``p_best``, ``holm_p`` (against the best) and ``near_best`` (in that set)."""
    if best is None:
        return None
    scores = {f["step"]: {rid: v[0] for rid, v in tables[f["step"]].items()} for f in ranked}
    p_values = {f["step"]: (f["vs_best"] or {}).get("p_value") for f in ranked if f is not best}
    held = best_step(scores, best["step"], p_values)
    for f in ranked:
        f["p_best"] = held["p_best"].get(f["step"])
        f["holm_p"] = held["holm_p"].get(f["step"])
        f["near_best"] = f["step"] in held["indistinguishable"]
    return held


def undistinguished_note(best: dict | None, figures: list[dict], held: dict | None) -> list[str]:
    """A note when the best step is not told apart from others by the test that makes the set (and the
    collapse flag): their Holm-adjusted paired p-value against it is at least alpha."""
    if best is None or held is None:
        return []
    tied = [s for s in held["indistinguishable"] if s != best["step"]]
    if not tied:
        return []
    label = "base" if best["label"] == "base" else f"step {best['step']}"
    bases = {f["step"] for f in figures if f.get("label") == "base"}  # named as the table and the best line name it
    named = [("base" if s in bases else f"step {s}") for s in tied]
    return [f"the best ({label}, P(best) {held['p_best'].get(best['step'], 0):.0%}) is not distinguishable from "
            f"{', '.join(named)}: their paired test against it, Holm-corrected over "
            f"{len(held['holm_p'])} step(s), gives p >= {held['alpha']} (more evaluation rows would tell them apart)"]


def unscored_note(figures: list[dict]) -> list[str]:
    """Accuracy counts the answers with ground truth only: said (one step's counts) when some answers of a
    checkpoint had none, so a sweep's accuracies are not read as over every request."""
    partial = next((f for f in figures if 0 < (f.get("scored") or 0) < f["rows"] - f["errors"]), None)
    if partial is None:
        return []
    answered = partial["rows"] - partial["errors"]
    return [f"accuracy is over the answers with ground truth: {partial['scored']} of {answered} at step "
            f"{partial['step']} ({answered - partial['scored']} have none in the manifest)"]
