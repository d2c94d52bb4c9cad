"""VLMEvalKit's evaluation sets as they lie on disk: a TSV file (MMBench, MMStar, MathVista_MINI, MMMU, …)
with an ``index`` column, the image as base64 in ``image`` (or a list of them; or, as MMBench writes a
repeated image, the ``index`` of the row holding it), the ``question``, option columns ``A``, ``B``, …,
an optional ``hint`` and the ``answer``.

Each row becomes the request VLMEvalKit would send: its images first, then the prompt its multiple-choice
datasets build (``ImageMCQDataset.build_prompt``)::

    Hint: {hint}\\n            (when the row has one)
    Question: {question}\\n
    Options:\\n
    A. {A}\\n                  (every option column that is not empty, in letter order)
    Please select the correct answer from the options above. \\n

with ``answer`` as the truth and the ``choice`` scorer. A row without options is a plain question (its
VQA datasets' prompt: the question as it is), scored by the manifest's default scorer. The id is the
``index``. Images are kept as references (the row's byte offset in the file) and decoded from base64
when their batch is prepared; nothing is written to disk.
"""

from __future__ import annotations

import ast
import base64
import binascii
import csv
import io
import string
import sys
from dataclasses import replace
from pathlib import Path

from vlmfast.errors import InputError
from vlmfast.evaluation.scoring import truth_text
from vlmfast.inputs.embedded import EmbeddedImage
from vlmfast.inputs.records import BadInput, Problem, Request, check_image_bytes

MCQ_TAIL = "Please select the correct answer from the options above. \n"
TEXT_COLUMNS = ("question", "hint", "answer", *string.ascii_uppercase)


def is_tsv(path: str) -> bool:
    """Whether ``--manifest PATH`` is a VLMEvalKit TSV file."""
    return Path(path).suffix.lower() == ".tsv"


def build_prompt(row: dict) -> tuple[str, bool]:
    """The prompt VLMEvalKit builds for the row, and whether it is multiple choice."""
    options = {c: row[c] for c in string.ascii_uppercase if _given(row.get(c))}
    if not options:
        return row.get("question") or "", False
    prompt = f"Hint: {row['hint']}\n" if _given(row.get("hint")) else ""
    prompt += f"Question: {row.get('question') or ''}\n"
    prompt += "Options:\n" + "".join(f"{key}. {item}\n" for key, item in options.items())
    return prompt + MCQ_TAIL, True


def _given(value) -> bool:
    """A cell pandas would not read as NaN (empty, or one of its NaN spellings)."""
    return value is not None and value.strip() not in ("", "nan", "NaN", "None", "null", "NA", "N/A")


def _records(path: Path):
    """``(byte offset, raw record)`` of every record after the header, a record running over several lines
    while a quoted field is open (an even count of quote characters closes it)."""
    with open(path, "rb") as f:
        f.readline()  # the header
        offset, pending, start = f.tell(), b"", None
        for line in iter(f.readline, b""):
            if start is None:
                start = offset
            pending += line
            offset += len(line)
            if pending.count(b'"') % 2 == 0:
                yield start, pending
                pending, start = b"", None
        if pending.strip():
            yield start, pending


def _parse(raw: bytes, columns: list[str]) -> dict:
    csv.field_size_limit(sys.maxsize)  # a base64 image is megabytes in one cell
    values = next(csv.reader(io.StringIO(raw.decode("utf-8")), delimiter="\t"), [])
    return dict(zip(columns, values))


def _header(path: Path) -> list[str]:
    with open(path, "rb") as f:
        first = f.readline().decode("utf-8-sig")
    return next(csv.reader(io.StringIO(first), delimiter="\t"), [])


def read_tsv(path: str, default_prompt: str | None, max_image_pixels: int | None = None) -> tuple[list, list[str]]:
    """Requests (and bad rows) of a VLMEvalKit TSV file, in row order (see the module docstring)."""
    p = Path(path)
    try:
        columns = _header(p)
        records = list(_records(p))
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read manifest {path}: {exc}", hint="give a UTF-8, tab-separated VLMEvalKit file") from exc
    if "image" not in columns:
        raise InputError(f"{path} has no image column (columns: {', '.join(columns)})",
                         hint="VLMEvalKit TSVs hold base64 images in an 'image' column")
    rows = [(offset, _parse(raw, columns)) for offset, raw in records]
    by_index = {row.get("index"): offset for offset, row in rows if row.get("index")}
    cells = {offset: row.get("image") or "" for offset, row in rows}
    items, extra = [], sorted(set(columns) - {"index", "image", "image_path", *TEXT_COLUMNS})
    for number, (offset, row) in enumerate(rows):
        where = f"{path}#row={number}"
        rid = row.get("index") or str(number)
        prompt, mcq = build_prompt(row)
        prompt = prompt if prompt.strip() else default_prompt
        if not prompt:
            items.append(BadInput(rid, (Problem(where, "no question in the row (--prompt gives one for all)"),)))
            continue
        images, source = _images(row.get("image") or "", offset, by_index, cells)
        labels = tuple(f"{path}#row={number}/image={k}" for k in range(len(images)))
        refs = tuple(EmbeddedImage(str(p), "tsv", source, number, "image", k if len(images) > 1 else None)
                     for k in range(len(images)))
        problems, sizes = [], []
        for label, data in zip(labels, images):
            size, problem = check_image_bytes(data, max_image_pixels) if data is not None else (None, "not base64")
            sizes.append(size)
            if problem is not None:
                problems.append(Problem(label, problem))
        if not images:
            problems.append(Problem(where, "no image in column \"image\""))
        answer = row.get("answer") if _given(row.get("answer")) else None
        record = {k: v for k, v in row.items() if k not in ("image",)}
        request = Request(id=rid, images=labels, prompt=prompt, system=None, truth=truth_text(answer),
                          scorer="choice" if mcq and answer is not None else None, data_source=None,
                          manifest_truth=answer, record=record, image_data=refs or None)
        if problems:
            items.append(BadInput(rid, tuple(problems), request))
            continue
        items.append(replace(request, image_sizes=tuple(sizes)))
    if not items:
        raise InputError(f"manifest {path} holds no rows", hint="give a TSV with a header and at least one row")
    return items, ([f"{path}: columns kept in the rows, not in the prompt: {', '.join(extra)}"] if extra else [])


def _images(cell: str, offset: int, by_index: dict, cells: dict) -> tuple[list[bytes | None], int]:
    """The row's images as bytes (None where a value is not base64) and the byte offset of the row that
    holds them (MMBench names another row's ``index`` for a repeated image)."""
    cell = cell.strip()
    if len(cell) < 64 and cell in by_index:
        offset = by_index[cell]
        cell = cells[offset].strip()
    return [_decode(v) for v in _as_list(cell)], offset


def _as_list(cell: str) -> list[str]:
    if cell.startswith("["):
        try:
            parsed = ast.literal_eval(cell)
        except (ValueError, SyntaxError):
            return [cell]
        return [str(v) for v in parsed] if isinstance(parsed, list) else [cell]
    return [cell] if cell else []


def _decode(value: str) -> bytes | None:
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return None


def fetch_tsv_bytes(refs: list[EmbeddedImage]) -> dict[EmbeddedImage, bytes]:
    """The decoded bytes of every TSV image in ``refs``: each row read again from its byte offset (the
    ``chunk`` of the reference), its image cell decoded from base64."""
    found = {}
    columns: dict[str, list[str]] = {}
    for ref in refs:
        if ref.path not in columns:
            columns[ref.path] = _header(Path(ref.path))
        row = _parse(_record_at(Path(ref.path), ref.chunk), columns[ref.path])
        values = _as_list((row.get(ref.column) or "").strip())
        data = _decode(values[ref.index or 0]) if len(values) > (ref.index or 0) else None
        if data is None:
            raise InputError(f"{ref.path}: row {ref.offset} no longer holds image {ref.index or 0}",
                             hint="the file changed since the run started")
        found[ref] = data
    return found


def _record_at(path: Path, offset: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(offset)
        pending = b""
        for line in iter(f.readline, b""):
            pending += line
            if pending.count(b'"') % 2 == 0:
                break
    return pending
