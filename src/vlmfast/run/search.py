"""Which checkpoints of a long run a sweep evaluates: all of them, or (``--search coarse``) every k-th one,
then the neighbours of the best until the best has both neighbours evaluated or is an end of the run.

On a smooth accuracy curve this finds the peak evaluating about ``8 + a few`` of 50 checkpoints; on a
noisy one it finds a local best, which the report says by listing the steps it skipped. A later plain
sweep into the same output directory evaluates only what was skipped.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

SEARCHES = ("all", "coarse")
COARSE_TARGET = 8  # checkpoints the coarse pass evaluates when --every is not given


def coarse_every(count: int, target: int = COARSE_TARGET) -> int:
    """The stride that evaluates about ``target`` of ``count`` checkpoints."""
    return max(1, math.ceil(count / target))


def coarse_steps(steps: Sequence[int], every: int) -> list[int]:
    """Every ``every``-th step from the first, and the last step (so both ends are known)."""
    picked = list(steps[::every])
    if steps and steps[-1] not in picked:
        picked.append(steps[-1])
    return picked


def neighbours_to_evaluate(steps: Sequence[int], accuracy: dict[int, float | None]) -> list[int]:
    """The best evaluated step's neighbours in ``steps`` that are not evaluated yet (ties: the earlier
    step is best, as in the sweep's report). Empty when the search is done."""
    ranked = [(a, -s) for s, a in accuracy.items() if a is not None and s in steps]
    if not ranked:
        return []
    best = -max(ranked)[1]
    i = list(steps).index(best)
    around = [steps[j] for j in (i - 1, i + 1) if 0 <= j < len(steps)]
    return [s for s in around if s not in accuracy]


def steering_accuracy(figures: dict) -> float | None:
    """The accuracy the search steers by: a step's failed requests (out of memory even alone, vLLM's unfinished
    rows) count as wrong, as the report judges them once other steps answered them — a step that finished 8 of
    9 right and failed 3 must not look best and draw the search to its neighbours. A request that fails on
    every step lowers every step alike. With ``--n K`` a failed request stands for the answers it lacks of K,
    however many error rows it has (``failed_answers``; figures without it: ``failed_requests`` × K, or ``errors``
    × K where only rows were counted). The figures do not say which failed requests have a ground truth, so all
    count: the search steers, the report then judges."""
    accuracy, scored = figures.get("accuracy"), figures.get("scored") or 0
    missing = figures.get("failed_answers")
    if missing is None:
        k = (figures.get("samples") or {}).get("samples_per_request") or 1
        missing = (figures.get("failed_requests", figures.get("errors")) or 0) * k
    if accuracy is None or not missing:
        return accuracy
    return accuracy * scored / (scored + missing)


def search(steps: Sequence[int], evaluate: Callable[[int], float | None], every: int | None = None) -> list[int]:
    """Evaluate ``steps`` by the coarse search; ``evaluate(step)`` returns the step's accuracy (None: no
    ground truth). Returns the steps evaluated, in the order they were."""
    accuracy: dict[int, float | None] = {}
    order = coarse_steps(steps, every or coarse_every(len(steps)))
    while order:
        for step in order:
            accuracy[step] = evaluate(step)
        order = neighbours_to_evaluate(steps, accuracy)
    return list(accuracy)
