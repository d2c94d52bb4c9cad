"""A sweep step's figures: accuracy with its interval over requests, health, errors, from the rows its results
file holds, summarized once (:func:`judged_scores`, handed to ``infer`` as ``scores_of``, so the summary in
infer's report is the one the step's figures take)."""

from __future__ import annotations

from pathlib import Path


def judged_scores(rows: list[dict]) -> dict:
    """:func:`vlmfast.evaluation.stats.summarize` over ``rows`` with the answers the reward function raised on
    counted wrong, as the sweep's figures count them (:func:`vlmfast.evaluation.flags.reward_errors_as_wrong`)."""
    from vlmfast.evaluation.flags import reward_errors_as_wrong
    from vlmfast.evaluation.stats import summarize

    return summarize(reward_errors_as_wrong(rows)[0])


def step_figures(entry, out: Path, rows: list[dict], report, how: str, seconds: float, table: dict | None = None,
                 scores: dict | None = None) -> dict:
    """A step's figures in the sweep's report from its ``rows`` (answers the reward raised on already counted
    wrong: :func:`vlmfast.evaluation.flags.reward_errors_as_wrong`), ``entry`` (its step, path and label) and
    infer's ``report`` (tokens/s, decode row utilization). ``table``: the rows' per-request table when made
    already; ``scores``: their :func:`vlmfast.evaluation.stats.summarize` when made already (:func:`judged_scores`,
    as infer's report carries it), else made here."""
    from vlmfast.evaluation.flags import missing_answers, per_request
    from vlmfast.evaluation.samples import request_interval
    from vlmfast.evaluation.stats import summarize

    scores = summarize(rows) if scores is None else scores
    ok = [r for r in rows if r.get("error") is None]
    scored = [r for r in ok if r.get("correct") is not None]
    correct = sum(bool(r["correct"]) for r in scored)
    # over requests: with --n K a request's K answers are one trial, not K independent ones
    low, high = request_interval([score for score, _, _ in (per_request(rows) if table is None else table).values()])
    figures = {
        "step": entry.step, "path": str(entry.path), "label": entry.label, "results": str(out),
        "rows": len(rows), "scored": len(scored), "accuracy": round(correct / len(scored), 4) if scored else None,
        "ci_low": None if low is None else round(low, 4), "ci_high": None if high is None else round(high, 4),
        **scores["health"],  # health(rows), as summarize computed it
        "tokens_per_s": report.tokens_per_s, "decode_row_utilization": getattr(report, "decode_row_utilization", None),
        f"{how}_s" if how != "none" else "load_s": round(seconds, 3),
        "errors": len(rows) - len(ok), "failed_requests": len({str(r.get("id")) for r in rows if r.get("error") is not None}),
        "failed_answers": missing_answers(rows),
        "reward_errors": sum(r.get("reward_error") is not None for r in ok),
    }
    if "samples" in scores:
        figures["samples"] = scores["samples"]
    if (scores.get("rewards") or {}).get("correct_from"):  # correctness read from the reward's accuracy sub-score
        figures["correct_from"] = scores["rewards"]["correct_from"]
    return figures
