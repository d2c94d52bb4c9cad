"""``vlmfast score``: score an existing results file against a manifest's ground truth.

Reads JSONL and JSON only — no model, no torch — so rescoring thousands of rows takes a moment. The
scores are the ones ``infer`` writes into its rows (same scorers, same options, same manifest reader).
"""

from __future__ import annotations

import json
from pathlib import Path

from .convert import read_truths
from .errors import InputError
from .files import atomic_write
from .results import read_existing
from .scoring import rescore
from .stats import summarize


def rescore_file(results: Path, manifest: str, *, scorer: str = "auto", iou: float = 0.5, bbox_space: str = "resized",
                 out: Path | None = None) -> dict:
    """Scores of every row of ``results`` (a vlmfast results JSONL) against ``manifest``: the summary
    (:func:`vlmfast.scoring.summarize`) plus what was matched. With ``out``, the rescored rows are
    written there too (atomically, in the results file's order)."""
    results = Path(results)
    if not results.is_file():
        raise InputError(f"{results}: no such results file", hint="give the --out file of a vlmfast infer run")
    rows, note = read_existing(results, repair=False)
    if not rows:
        raise InputError(f"{results}: holds no result rows", hint="give the --out file of a vlmfast infer run")
    truths = read_truths(manifest)
    scored = rescore(list(rows.values()), truths, default_scorer=scorer, iou=iou, bbox_space=bbox_space)
    if out is not None:
        atomic_write(Path(out), "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in scored).encode("utf-8"))
    summary = summarize(scored)
    summary.update(results=str(results), manifest=manifest, rows=len(scored),
                   rows_without_truth=sum(1 for r in scored if str(r["id"]) not in truths),
                   notes=[note] if note else [])
    return summary
