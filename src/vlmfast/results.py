"""JSONL results: written batch by batch (flushed + fsync'd), resumable, finally in input order.

A run killed half-way keeps every finished batch. Rerunning with the same ``--out`` reads the ids
already there and skips them; a torn last line (the writer died mid-line) is cut off and reported.
When the run completes, the file is rewritten atomically in input order.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

from .errors import InputError


def read_existing(path: Path) -> tuple[dict[str, dict], str | None]:
    """Rows already in ``path`` keyed by id, and a note if a torn last line was removed."""
    if not path.exists():
        return {}, None
    data = path.read_bytes()
    rows: dict[str, dict] = {}
    note = None
    lines = data.split(b"\n")
    good_bytes = 0
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            good_bytes += len(line) + 1
            continue
        try:
            row = json.loads(line)
            if not isinstance(row, dict) or "id" not in row:
                raise ValueError("not a result row")
        except ValueError:
            if number >= len(lines) - 1:  # the last line: a write cut short — repair it
                note = f"{path}: removed a torn last line ({len(line)} bytes) left by an interrupted run"
                break
            raise InputError(
                f"{path}:{number}: not a vlmfast result row; refusing to append to this file",
                hint="choose another --out file, or --overwrite to replace it",
            ) from None
        rows[str(row["id"])] = row
        good_bytes += len(line) + 1
    if note:
        with open(path, "r+b") as f:
            f.truncate(min(good_bytes, len(data)))
    return rows, note


class ResultsWriter:
    """Appends rows to a JSONL file one batch at a time; on stdout, emits rows in input order as
    soon as every earlier row is known (stdout cannot be rewritten at the end)."""

    def __init__(self, path: str | os.PathLike | None, *, overwrite: bool = False):
        self.path = Path(path) if path is not None else None
        self.done: dict[str, dict] = {}
        self.notes: list[str] = []
        self._file = None
        self._pending: dict[int, dict] = {}  # stdout only: position -> row, until its turn
        self._next = 0
        if self.path is None:
            return
        if overwrite and self.path.exists():
            self.path.unlink()
        self.done, note = read_existing(self.path)
        if note:
            self.notes.append(note)
        if self.path.parent and not self.path.parent.exists():
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, rows: Iterable[dict], positions: Iterable[int]) -> None:
        """One batch: every row, then flush and fsync, so a crash loses at most the batch in flight.
        ``positions`` are the rows' places in input order (0-based, each once)."""
        if self.path is None:
            self._pending.update(zip(positions, rows))
            ready = []
            while self._next in self._pending:
                ready.append(self._pending.pop(self._next))
                self._next += 1
            sys.stdout.write("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in ready))
            sys.stdout.flush()
            return
        text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
        if self._file is None:
            self._file = open(self.path, "a", encoding="utf-8")
        self._file.write(text)
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def finalize(self, order: list[str]) -> None:
        """Rewrite the file in input order (ids not in ``order`` — earlier runs — go last). Atomic."""
        self.close()
        if self.path is None or not self.path.exists():
            return
        rows, _ = read_existing(self.path)
        rank = {rid: i for i, rid in enumerate(order)}
        ordered = sorted(rows.values(), key=lambda r: (rank.get(str(r["id"]), len(rank)), str(r["id"])))
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in ordered)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
