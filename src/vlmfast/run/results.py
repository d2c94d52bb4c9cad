"""JSONL results: written batch by batch (flushed + fsync'd), resumable, finally in input order.

A run killed at any moment keeps every finished batch. Rerunning with the same ``--out`` skips the
ids already there; a torn last line (the writer died mid-line) is cut off and reported. With several
processes each appends to its own part file next to ``--out``; the main process merges the parts.
When the run completes, the file is rewritten atomically in input order.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
from collections.abc import Iterable
import re
from pathlib import Path

from vlmfast.errors import InputError, Interrupted
from vlmfast.files import atomic_write, part_files
from vlmfast.engines.rows import row_key
from vlmfast.run.results_bytes import ReadRows, file_state, render, unchanged


ROW_KEYS = ("id", "text", "finish_reason", "error")  # every row vlmfast writes has these; a manifest does not


def part_path(out: Path, rank: int) -> Path:
    """Where process ``rank`` appends its rows during a multi-process run."""
    return out.with_name(f".{out.name}.part{rank}")


def interrupted(written: int, out: Path | None, held: int = 0, overwrite: bool = False,
                written_to: Path | None = None) -> Interrupted:
    """What Ctrl-C left: the rows already on disk (each batch is written whole) or on stdout (``held`` of
    them printed out of input order), and how to go on. ``written_to``: a parallel run's part file, where
    this process's rows are until a rerun merges them into ``out``."""
    if written_to is not None and out is not None:
        return Interrupted(f"interrupted: the finished rows of this run are kept beside {out} ({written_to.name} "
                           f"and the other processes' part files: {written} from this process); a rerun merges them",
                           hint=resume_hint(overwrite))
    if out is None:
        late = f" ({held} of them out of input order: they finished before an earlier one)" if held else ""
        return Interrupted(f"interrupted after {written} row(s) on stdout{late}",
                           hint="rerun with --out FILE to be able to resume")
    if not written:
        return Interrupted(f"interrupted before this run wrote a row to {out}", hint="rerun the same command")
    return Interrupted(f"interrupted: this run's {written} finished row(s) are in {out}", hint=resume_hint(overwrite))


def resume_hint(overwrite: bool) -> str:
    """How to go on from the rows on disk: the same command — less ``--overwrite``, which would redo them."""
    return ("rerun the same command without --overwrite to resume where it stopped (with it, the finished rows "
            "are redone)" if overwrite else "rerun the same command to resume where it stopped")


def read_existing(path: Path, *, repair: bool = True) -> tuple[dict[str, dict], str | None]:
    """Rows already in ``path`` keyed by :func:`~vlmfast.engines.rows.row_key` (id, and sample when there are
    several answers per request), and a note if a torn last line was found (and, with
    ``repair``, cut off). Any other malformed line means the file is not ours: an InputError. The rows
    remember the file as it was read (:func:`finalize` leaves it alone when it would write the same bytes)."""
    if not path.exists():
        return {}, None
    with open(path, "rb") as f:
        data = f.read()
        read_as = file_state(os.fstat(f.fileno()), data)
    rows = ReadRows()
    rows.read_as = read_as
    lines = data.split(b"\n")
    good_bytes = 0
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            good_bytes += len(line) + 1
            continue
        try:
            row = json.loads(line)
            if not isinstance(row, dict) or not all(k in row for k in ROW_KEYS):
                raise ValueError("not a result row")
        except ValueError:
            if number == len(lines):  # no newline after it: a write cut short
                if repair:
                    with open(path, "r+b") as f:
                        f.truncate(min(good_bytes, len(data)))
                return rows, f"{path}: removed a torn last line ({len(line)} bytes) left by an interrupted run"
            raise InputError(
                f"{path}:{number}: not a vlmfast result row; refusing to append to this file",
                hint="choose another --out file, or --overwrite to replace it",
            ) from None
        rows[row_key(row["id"], row.get("sample"))] = row
        good_bytes += len(line) + 1
    if repair and data and not data.endswith(b"\n"):  # a whole last row whose newline was cut: the next append goes after it
        with open(path, "ab") as f:
            f.write(b"\n")
    return rows, None


def prepare_out(out: Path, *, overwrite: bool) -> tuple[dict[str, dict], list[str]]:
    """Main process, before a run: start afresh (``overwrite``: no rows taken; the old file stays until
    :func:`clear_out`, once the model is ready to run, so a run that fails before it loses nothing), or
    repair ``out`` and fold in part files a killed multi-process run left behind. Returns the rows ``out``
    now holds (read once) and what was done, to be said aloud."""
    out.parent.mkdir(parents=True, exist_ok=True)
    if overwrite:
        return {}, []
    rows, note = read_existing(out)
    merged, part_notes = merge_parts(out, rows)
    notes = ([note] if note else []) + part_notes
    if merged:
        notes.append(f"{out}: recovered {merged} row(s) from an interrupted multi-process run")
    return rows, notes


def clear_out(out: Path) -> None:
    """Remove ``out`` and its part files: an ``--overwrite`` run about to write its first rows."""
    for p in [out, *part_files(out)]:
        p.unlink(missing_ok=True)


def merge_parts(out: Path, rows: dict[str, dict]) -> tuple[int, list[str]]:
    """Append the rows of every part file next to ``out`` that ``out`` lacks or holds otherwise (``rows``: what
    it holds, updated in place), then delete the parts. A part's row is the newer one (parts are written after
    ``out`` was last merged: an error row retried with ``--retry-errors``); the file keeps both lines until
    :func:`finalize`, and :func:`read_existing` takes the last."""
    merged, notes = 0, []
    for part in part_files(out):
        part_rows, note = read_existing(part, repair=False)  # a torn tail is simply not taken
        notes += [note] if note else []
        new = [r for key, r in part_rows.items() if rows.get(key) != r]
        if new:
            _append(out, new)
            rows.update((row_key(r["id"], r.get("sample")), r) for r in new)
            merged += len(new)
        part.unlink()
    return merged, notes


def _append(path: Path, rows: list[dict]) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
        f.flush()
        os.fsync(f.fileno())


@contextlib.contextmanager
def sigint_deferred(second_stops: bool = False):
    """Ctrl-C (or SIGTERM) during a write lands after it: the batch is on disk whole, then KeyboardInterrupt.
    ``second_stops``: a second one stops at once (writes that may hang, such as a tracker's upload)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []

    def hold(signum, frame):
        received.append(signum)
        if second_stops and len(received) > 1:
            raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, hold) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if received:
            raise KeyboardInterrupt


class ResultsWriter:
    """Appends rows to a JSONL file one batch at a time; without a file and with ``stdout``, emits rows in
    input order as soon as every earlier row is known (stdout cannot be rewritten at the end); with
    neither, keeps nothing (the caller holds the rows)."""

    def __init__(self, path: str | os.PathLike | None, *, stdout: bool = False):
        self.path = Path(path) if path is not None else None
        self.stdout = stdout
        self._file = None
        self._pending: dict[int, dict] = {}  # stdout only: position -> row, until its turn
        self._next = 0
        self.printed = 0  # rows written to stdout

    def write(self, rows: Iterable[dict], positions: Iterable[int]) -> None:
        """One batch: every row, then flush and fsync, so a crash loses at most the batch in flight.
        ``positions`` are the rows' places in input order (0-based, each once)."""
        if self.path is None:
            if not self.stdout:
                return
            self._pending.update(zip(positions, rows))
            ready = []
            while self._next in self._pending:
                ready.append(self._pending.pop(self._next))
                self._next += 1
            self._print(ready)
            return
        text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
        with sigint_deferred():
            if self._file is None:
                self._file = open(self.path, "a", encoding="utf-8")
            self._file.write(text)
            self._file.flush()
            os.fsync(self._file.fileno())

    def _print(self, rows: list[dict]) -> None:
        sys.stdout.write("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
        sys.stdout.flush()
        self.printed += len(rows)

    def release_held(self) -> int:
        """stdout, a run cut short: print the finished rows still waiting for an earlier one (out of input
        order, each with its id) rather than lose them; returns how many."""
        held = [self._pending.pop(k) for k in sorted(self._pending)]
        self._print(held)
        return len(held)

    def close(self) -> None:
        if self._file is not None:
            file, self._file = self._file, None
            try:
                file.close()
            except OSError:  # the write that failed (a full disk) raised already: its error is the one to report
                pass


def finalize(out: Path, order: list[str], rows: dict[str, dict] | None = None) -> list[dict]:
    """Main process, after a run: rewrite ``out`` in input order (ids not in ``order`` — earlier runs — go
    last) and remove the part files. ``rows``: every row the file should hold, when the caller has them in
    memory (no re-read); else the file and its parts are read. Atomic: temp file + rename; not written at all
    when ``rows`` were read from ``out`` (:func:`read_existing`) and it holds these bytes already. Returns the rows."""
    if rows is None:
        rows, _ = read_existing(out)
        merge_parts(out, rows)
    for part in part_files(out):
        part.unlink()
    if not rows:
        return []
    rank = {rid: i for i, rid in enumerate(order)}
    ordered = sorted(rows.values(), key=lambda r: (rank.get(str(r["id"]), len(rank)), str(r["id"]), r.get("sample") or 0))
    data = render(ordered)
    if not unchanged(out, rows, data):  # a finished file read back as it is stays as it is (its inode and times too)
        atomic_write(out, data)
    return ordered


def renamed_legacy_ids(existing: dict[str, dict], requests: list, notes: list[str], bad_ids=()) -> dict[str, dict]:
    """Rows that vlmfast 0.12 and earlier wrote for manifest records without an id carry the image path as
    resolved against the manifest's folder; today such a record's id is the path as the record writes it.
    An unreadable manifest line's error row was named by the manifest's path as given and the line (0.14 and
    earlier), today by the file's name and the line (``bad_ids``). Rows made from a manifest that ``vlmfast
    convert`` wrote in 0.18.9 and earlier carry its ``NNNNN_<image stem>`` ids (:func:`converted_ids`). Those rows
    take today's id, so a resume neither runs their requests again nor keeps them twice: a row already under
    today's id is kept, the earlier one dropped."""
    ids = {r.id for r in requests}
    if not set(bad_ids) - ids and all(str(row["id"]) in ids for row in existing.values()):
        return existing  # every row under an id of today's (a resume of this vlmfast's rows): none is renamed below
    legacy = {r.images[0]: r.id for r in requests if r.images and r.images[0] != r.id and r.images[0] not in ids
              and Path(r.images[0]).as_posix().endswith("/" + Path(r.id).as_posix().lstrip("./"))}
    named = set(bad_ids) - ids
    legacy.update({str(row["id"]): Path(str(row["id"])).name for row in existing.values()
                   if row.get("error") is not None and re.search(r":\d+$", str(row["id"])) and Path(str(row["id"])).name in named
                   and Path(str(row["id"])).name != str(row["id"])})
    legacy.update(converted_ids(existing.values(), requests, bad_ids))
    if not legacy or not any(str(row["id"]) in legacy for row in existing.values()):
        return existing
    renamed = {key: row for key, row in existing.items() if str(row["id"]) not in legacy}
    moved = dropped = 0
    for row in existing.values():
        if (new := legacy.get(str(row["id"]))) is not None:
            key = row_key(new, row.get("sample"))
            moved, dropped = (moved + 1, dropped) if key not in renamed else (moved, dropped + 1)
            renamed.setdefault(key, {**row, "id": new})
    notes.append(f"{moved} row(s) an earlier vlmfast wrote under another id (an image's resolved path, a manifest "
                 "line's path, convert's NNNNN_<image stem>) now carry today's"
                 + (f"; {dropped} more were dropped: a row under today's id was there already" if dropped else ""))
    return renamed


_CONVERTED_ID = re.compile(r"(\d{5,})_(.+)")  # convert in 0.18.9 and earlier: f"{index:05d}_{Path(images[0]).stem}"


def converted_ids(rows: Iterable[dict], requests: list, bad_ids=()) -> dict[str, str]:
    """Row id → today's id, for the rows' ids ``vlmfast convert`` gave an ms-swift record without an id in
    0.18.9 and earlier: ``NNNNN_<image stem>``, its position in the file and its first image's stem. Now
    it writes the id ``--manifest`` gives the record read as it is, its first image as written (``IMAGE#2``, …
    for later ones: :func:`vlmfast.inputs.records.image_id`); the converted manifest's records, one a line, keep
    their positions. A row id maps only where no request or bad line has it (a VLM-R1 line's id, or a record's own,
    of that form stays), one JSONL record holds that position (``Request.position``), its first image has that
    stem and its id is that image (ranked) — not an id of its own —, and the row, where it says, asked that
    record's question of images of those names."""
    ids = {r.id for r in requests} | set(bad_ids)
    at: dict[int, list] = {}
    for r in requests:
        if r.position is not None:
            at.setdefault(r.position, []).append(r)
    mapped = {}
    for row in rows:
        rid = str(row["id"])
        match = _CONVERTED_ID.fullmatch(rid)
        if rid in ids or match is None or str(int(match[1])).zfill(5) != match[1] or len(at.get(int(match[1]), ())) != 1:
            continue
        request, stem = at[int(match[1])][0], match[2]
        prompt, images = row.get("prompt"), row.get("images")
        if (request.images and Path(request.images[0]).stem == stem
                and Path(re.sub(r"#\d+$", "", request.id)).stem == stem
                and (not isinstance(prompt, str) or request.prompt.strip() in prompt)
                and (not isinstance(images, list) or [os.path.basename(str(p)) for p in images]
                     == [os.path.basename(p) for p in request.images])):
            mapped[rid] = request.id
    return mapped


def rows_under_todays_ids(rows: list[dict], requests: list, notes: list[str], manifest: str) -> list[dict]:
    """``rows`` (a results file scored against ``manifest``'s ``requests``) with every id :func:`converted_ids` maps
    replaced by today's, unless a row already holds today's id (the earlier row keeps its id: not in the manifest)."""
    have = {str(row["id"]) for row in rows}
    new = {old: rid for old, rid in converted_ids(rows, requests).items() if rid not in have}
    if not new:
        return rows
    old = next(iter(new))
    notes.append(f"{sum(str(row['id']) in new for row in rows)} row(s) carry the id an earlier vlmfast convert gave "
                 f"their record (NNNNN_<image stem>: {old}, …): matched under the id {manifest} gives it now ({new[old]}, …)")
    return [{**row, "id": new[str(row["id"])]} if str(row["id"]) in new else row for row in rows]


def recheck_kept(existing: dict[str, dict], requests: list, out, options, reward=None, write: bool = True) -> list[str]:
    """Rows an earlier run left in ``out``, checked against this run's ``requests`` before a resume keeps them,
    when the manifest changed since they were written (in place: lines only appended count as unchanged).
    Ids by position (a parquet row, a TSV line without ``index``) then may name other requests: a kept row
    whose request has another prompt, other images or images of other sizes is refused (a UsageError naming
    the ids); the others are scored again, in place, against today's ground truth (answers corrected since),
    with the same scorer or reward as new rows (without the token ids, which rows do not keep). The manifest's
    state is then recorded (``write``), so the next resume skips this. Returns what to say."""
    from vlmfast.errors import UsageError
    from vlmfast.run.sweep_record import manifest_state, manifest_unchanged, remember_manifest

    if not options.manifest or not Path(options.manifest).exists() or manifest_unchanged(out, options.manifest):
        return []  # the common resume reads the manifest once, to tell that it did not change
    by_id = {r.id: r for r in requests}
    kept = [row for row in existing.values() if row.get("error") is None and str(row["id"]) in by_id]
    other = sorted({str(row["id"]) for row in kept if _asked_otherwise(row, by_id[str(row["id"])])})
    if other:
        raise UsageError(f"{out} holds answers to other requests than {len(other)} id(s) name now "
                         f"({', '.join(other[:5])}{' …' if len(other) > 5 else ''}): {options.manifest} changed since, "
                         "and its ids name other prompts or images", hint="rerun with --overwrite to redo them, or give "
                         "another --out (ids by row position move when rows are removed or reordered: give records an id)")
    truths = {str(row["id"]): by_id[str(row["id"])].truth_record() for row in kept}
    before = [row.get("correct") for row in kept]
    if reward is not None:  # a row it raises on keeps its earlier score (a function reading completion_ids, …)
        fields = reward.score_rows(kept, truths, skip_bad=True)
        failed = sum(f.get("reward_error") is not None for f in fields)
        fields = [{} if f.get("reward_error") is not None else f for f in fields]
    else:
        from vlmfast.evaluation.scoring import score_row

        fields = [score_row(row, truths[str(row["id"])]["ground_truth"], truths[str(row["id"])]["scorer"]
                            or options.scorer, iou=options.iou, bbox_space=options.bbox_space,
                            as_written=truths[str(row["id"])]["reference_truth"]) for row in kept]
    for row, scored in zip(kept, fields):
        row.update(scored)
    if write:
        remember_manifest(out, manifest_state(options.manifest))
    changed = sum(a != row.get("correct") for a, row in zip(before, kept))
    notes = [f"{out}: {options.manifest} changed since the kept answers were written: they were scored again against "
             f"its ground truth, and {changed} changed verdict"] if changed else []
    if reward is not None and failed:
        notes.append(f"{out}: the reward function raised on {failed} kept answer(s) scored again (rows keep no token ids): "
                     "their earlier scores stand")
    return notes


def _asked_otherwise(row: dict, request) -> bool:
    """Whether a kept row answered another request than ``request``: another prompt, other image files (by
    name: a run resumed from another directory spells paths otherwise) or images of other sizes."""
    images, sizes = row.get("images"), row.get("image_sizes")
    return (row.get("prompt") not in (None, request.prompt)
            or isinstance(images, list) and [os.path.basename(str(p)) for p in images]
            != [os.path.basename(str(p)) for p in request.images]
            or isinstance(sizes, list) and request.image_sizes and [list(x) for x in sizes]
            != [list(x) for x in request.image_sizes])
