"""The train ↔ eval parity table of ``infer`` and ``sweep`` (:mod:`vlmfast.run.parity`), on stderr."""

from __future__ import annotations

import json

from rich.markup import escape
from rich.table import Table

from vlmfast.report.terminal import render_note, stderr


def _cell(value, width: int = 60) -> str:
    text = "–" if value is None else value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    text = " ".join(text.split())
    return escape(text if len(text) <= width else text[:width - 1] + "…")


def render_parity(parity: dict | None) -> None:
    """Training vs evaluation settings (``infer``, ``sweep``): one line per setting the training recorded,
    then what ``--match-training`` adopted and the notes; only the note when no training file was found."""
    if not parity:
        return
    if parity["rows"]:
        table = Table(title=f"train ↔ eval ({escape(parity['trainer'] or '')}: {escape(', '.join(parity['files']))})",
                      title_justify="left")
        for column in ("setting", "training", "evaluation", "", "training source"):
            table.add_column(column)
        for r in parity["rows"]:
            mark = {True: "[green]same[/green]", False: "[yellow]differs[/yellow]", None: "?"}[r["same"]]
            ours = r["evaluation"] if r["evaluation"] is not None else f"none: {r.get('evaluation_source', '')}"
            table.add_row(r["setting"], _cell(r["training"]), _cell(ours), mark, escape(r["source"]))
        stderr.print(table)
    for line in parity.get("adopted", []):
        render_note(f"--match-training adopted {line}")
    for line in parity.get("not_adopted", []):
        render_note(f"--match-training did not adopt {line}")
    for note in parity.get("notes", []):
        render_note(note)
