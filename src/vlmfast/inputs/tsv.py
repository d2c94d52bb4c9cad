"""VLMEvalKit's evaluation sets as they lie on disk: a TSV file (MMBench, MMStar, MathVista_MINI, MMMU, …)
with an ``index`` column, the image as base64 in ``image`` (or a list of them; or, as MMBench writes a
repeated image, the ``index`` of the row holding it), the ``question``, option columns ``A``, ``B``, …,
an optional ``hint`` and the ``answer``.

Each row becomes the request VLMEvalKit sends a Qwen-VL model: its images first, then the prompt of the
dataset (VLMEvalKit e8e78f0). Its Qwen2.5-VL, Qwen3-VL and Qwen3.5 entries in vlmeval/config.py set
``use_custom_prompt=False``, and for a TSV it does not know by name (``DATASET_TYPE`` is None) no wrapper
builds its own, so the dataset's ``build_prompt`` writes it. A file with columns ``A`` and ``B`` is
multiple choice, as vlmeval/dataset/__init__.py ``build_dataset`` decides for a custom set
(``CustomMCQDataset``: vlmeval/dataset/image_mcq.py ``ImageMCQDataset.build_prompt``)::

    Hint: {hint}\n            (when the row has one)
    Question: {question}\n
    Options:\n               (these two parts when the row has an option)
    A. {A}\n                  (every option column that is not missing, in letter order)
    Please select the correct answer from the options above. \n

with ``answer`` as the truth and the ``choice`` scorer. Any other file is VQA (``CustomVQADataset``,
vlmeval/dataset/image_vqa.py): the prompt is the question as it is, scored by the manifest's default
scorer. Cells are printed as pandas reads them (:mod:`vlmfast.inputs.tsv_cells`). Where VLMEvalKit sends
another prompt: Qwen2-VL's entries keep ``Qwen2VLPromptMixin`` (vlmeval/vlm/qwen2_vl/prompt.py), used
for sets VLMEvalKit registers by name (MMBench_DEV_EN, …): the multiple-choice prompt stripped at the end
(``请直接回答选项字母。`` in place of the English line when the text is Chinese), "\nPlease try to answer the
question with short words or phrases if possible." after a VQA question, " Please answer yes or no." after
HallusionBench's and POPE's. The id is the ``index``. Images are kept as references (the row's byte offset
in the file) and decoded from base64 when their batch is prepared; nothing is written to disk.

Rows are split as pandas' ``read_csv(sep="\t")`` splits them (VLMEvalKit reads these files so), with
:mod:`csv`'s same rules, a line at a time so that each record keeps its byte offset: a quote opens a quoted
field only at a field's start, a quote inside a field is text, blank lines are skipped.
"""

from __future__ import annotations

import ast
import base64
import binascii
import csv
import string
import sys
from dataclasses import replace
from pathlib import Path

from vlmfast.errors import InputError
from vlmfast.evaluation.scoring import truth_text
from vlmfast.inputs.embedded import EmbeddedImage
from vlmfast.inputs.records import BadInput, Problem, Request, check_image_bytes
from vlmfast.inputs.tsv_cells import is_missing, printed

MCQ_TAIL = "Please select the correct answer from the options above. \n"
TEXT_COLUMNS = ("question", "hint", "answer", *string.ascii_uppercase)
PROMPT_COLUMNS = ("question", "hint", *string.ascii_uppercase)
SHORT = 64  # an image cell this long or shorter names the row holding the image (vlmeval/dataset/image_base.py)


def is_tsv(path: str) -> bool:
    """Whether ``--manifest PATH`` is a VLMEvalKit TSV file."""
    return Path(path).suffix.lower() == ".tsv"


def build_prompt(row: dict, mcq: bool) -> str:
    """The prompt VLMEvalKit's dataset builds for the row (its cells as :func:`vlmfast.inputs.tsv_cells.printed`
    gives them, None where missing); ``mcq``: the file has option columns ``A`` and ``B``."""
    if not mcq:
        return row.get("question") or ""
    options = {c: row[c] for c in string.ascii_uppercase if row.get(c) is not None}
    prompt = f"Hint: {row['hint']}\n" if row.get("hint") is not None else ""
    prompt += f"Question: {row['question'] if row.get('question') is not None else 'nan'}\n"  # pandas' NaN prints so
    if options:
        prompt += "Options:\n" + "".join(f"{key}. {item}\n" for key, item in options.items()) + MCQ_TAIL
    return prompt


class _Unreadable(Exception):
    """Where the file cannot be read on: its line, what is wrong there, and what to do (None: the rows after
    it cannot be told apart, a quote's doing)."""

    def __init__(self, line: int, what: str, hint: str | None = None):
        super().__init__(what)
        self.line, self.what, self.hint = line, what, hint


def _records(f):
    """``(first line, byte offset, fields, lines)`` of every record from the file's position on (the header
    first when it starts at 0), read as pandas' ``read_csv(sep="\\t")`` reads it: a quote opens a quoted
    field only at the start of a field (a quoted field may run over several lines, ``""`` inside it is
    one quote); anywhere else it is a quote. A quoted field still open at the end of the file raises
    :class:`_Unreadable` naming the line it opened on, rather than losing the rows after it."""
    csv.field_size_limit(sys.maxsize)  # a base64 image is megabytes in one cell
    offset, line = f.tell(), 1
    read = {"bytes": 0, "lines": 0, "ended": False}

    def lines():
        for raw in iter(f.readline, b""):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise _Unreadable(line + read["lines"], f"not UTF-8 text (byte 0x{raw[exc.start]:02x} at byte "
                                                        f"{exc.start + 1} of line {line + read['lines']})", _NOT_UTF8_HINT) from None
            if read["bytes"] == 0 and offset == 0:
                text = text.removeprefix("\ufeff")  # a byte-order mark
            read["bytes"] += len(raw)
            read["lines"] += 1
            yield text
        read["ended"] = True

    reader = csv.reader(lines(), delimiter="\t")
    while True:
        try:
            fields = next(reader, None)
        except csv.Error as exc:
            raise _Unreadable(line, f"not a tab-separated record ({exc})") from exc
        if fields is None:
            return
        if read["ended"]:  # csv hands over what it holds when the input ends inside a quoted field
            raise _Unreadable(line, f"a field opened with a quote (\") here is still open at the end of the file "
                                    f"({read['lines']} lines read as one row)")
        yield line, offset, fields, read["lines"]
        offset += read["bytes"]
        line += read["lines"]
        read["bytes"] = read["lines"] = 0


def _blank(fields: list[str]) -> bool:
    """An empty line (pandas skips them, as the JSONL reader does)."""
    return len(fields) <= 1 and not "".join(fields).strip()


_NOT_UTF8_HINT = ("VLMEvalKit reads TSVs as UTF-8: convert the file (e.g. iconv -f latin1 -t utf-8 IN.tsv > OUT.tsv, "
                  "naming the encoding it was written in)")
_EXTRA_TAB_HINT = ("a tab inside a cell splits it in two: put that cell in quotes, or replace the tab (pandas, "
                   "VLMEvalKit's reader, stops at such a row too)")
_UNREADABLE_HINT = ("a quote (\") at the start of a field opens a quoted field that runs to the next quote, as "
                    "pandas reads it for VLMEvalKit: double a quote inside a quoted field (\"6\"\" ruler\"), or quote "
                    "the whole field")


def read_tsv(path: str, default_prompt: str | None, max_image_pixels: int | None = None, *,
             images: bool = True) -> tuple[list, list[str]]:
    """Requests (and bad rows) of a VLMEvalKit TSV file, in row order (see the module docstring).
    ``images=False``: the images are neither decoded nor checked (reading ground truths needs ids and
    answers only)."""
    p = Path(path)
    rows, joined = [], []  # joined: where a quoted field holds whole lines with tabs (rows read as one?)
    # rows: (row, byte offset, the image cell when it is short: maybe another row's index, the images' check)
    try:
        with open(p, "rb") as f:
            records = _records(f)
            columns = next(records, (0, 0, []))[2]
            if "image" not in columns and "image_path" in columns:
                raise InputError(f"{path} names its images by image_path only (no image column): vlmfast reads a TSV's "
                                 "images as base64 from its 'image' column, not by path (VLMEvalKit reads such paths "
                                 "against its working directory, else $LMUData/images/<dataset name>)",
                                 hint="write a JSONL manifest instead, one {\"id\", \"image\": PATH, \"prompt\", "
                                      "\"answer\"} line per row (relative paths are read against its folder, or "
                                      "--image-root DIR), or embed the images as base64 in an 'image' column")
            if "image" not in columns:
                raise InputError(f"{path} has no image column (columns: {', '.join(columns)})",
                                 hint="VLMEvalKit TSVs hold base64 images in an 'image' column")
            for line, offset, fields, lines in records:
                if _blank(fields):
                    continue
                if len(fields) > len(columns) and lines > 1:  # a quote that opened a field by mistake, run into later rows
                    raise _Unreadable(line, f"{len(fields)} fields where the header has {len(columns)} ({lines} lines "
                                            "read as one row)")
                if len(fields) > len(columns):
                    raise _Unreadable(line, f"{len(fields)} fields where the header has {len(columns)}: a tab too "
                                            "many in the row?", _EXTRA_TAB_HINT)
                if lines > 1 and any("\t" in v and "\n" in v for v in fields):
                    joined.append(line)
                row = dict(zip(columns, fields))
                cell = row.pop("image", None) or ""
                short = cell.strip() if len(cell.strip()) <= SHORT else None
                rows.append((row, offset, short, None if short is not None else _checked(cell, images, max_image_pixels)))
    except _Unreadable as exc:
        rest = "; the rows after it cannot be told apart" if exc.hint is None else ""
        raise InputError(f"{path}:{exc.line}: {exc.what}{rest}", hint=exc.hint or _UNREADABLE_HINT) from None
    except OSError as exc:
        raise InputError(f"cannot read manifest {path}: {exc}", hint="give a UTF-8, tab-separated VLMEvalKit file") from exc
    by_index = {row.get("index"): k for k, (row, *_) in enumerate(rows) if row.get("index")}
    items, extra = [], sorted(set(columns) - {"index", "image", "image_path", *TEXT_COLUMNS})
    mcq = "A" in columns and "B" in columns
    texts = printed([row for row, *_ in rows], PROMPT_COLUMNS)
    for number, (row, offset, short, checks) in enumerate(rows):
        where = f"{path}#row={number}"
        rid = row.get("index") or str(number)
        prompt = build_prompt(texts[number], mcq)
        prompt = prompt if prompt.strip() else default_prompt
        if not prompt:
            items.append(BadInput(rid, (Problem(where, "no question in the row (--prompt gives one for all)"),)))
            continue
        source = offset
        if short is not None and short in by_index:  # MMBench: a repeated image names the row that holds it
            held = rows[by_index[short]]
            source, checks = held[1], held[3] if held[3] is not None else [(None, None if not images else (
                f"the image cell {short!r} names row {short}, which holds no image of its own (VLMEvalKit asserts it does)"))]
        elif short:  # VLMEvalKit asserts that the row it names is there
            checks = [(None, None if not images else (
                f"the image cell {short!r} names no row: no row has index {short} (a cell of up to {SHORT} characters "
                "is the index of the row holding the image, as MMBench writes a repeated one)"))]
        elif short is not None:
            checks = []
        labels = tuple(f"{path}#row={number}/image={k}" for k in range(len(checks)))
        refs = tuple(EmbeddedImage(str(p), "tsv", source, number, "image", k if len(checks) > 1 else None)
                     for k in range(len(checks)))
        problems = [Problem(label, problem) for label, (_, problem) in zip(labels, checks) if problem is not None]
        if not checks and images:
            problems.append(Problem(where, "no image in column \"image\""))
        answer = row.get("answer") if not is_missing(row.get("answer")) else None
        request = Request(id=rid, images=labels, prompt=prompt, system=None, truth=truth_text(answer),
                          scorer="choice" if mcq and answer is not None else None, data_source=None,
                          manifest_truth=answer, record=row, image_data=refs or None, source=where)
        if problems:
            items.append(BadInput(rid, tuple(problems), request))
            continue
        items.append(replace(request, image_sizes=tuple(size for size, _ in checks)) if images else request)
    if not items:
        raise InputError(f"manifest {path} holds no rows", hint="give a TSV with a header and at least one row")
    notes = [f"{path}: columns not in the prompt, handed to reward functions: {', '.join(extra)} (the accuracy per "
             f"value: vlmfast score --by {extra[0]})"] if extra else []
    if joined:  # pandas reads them so too; said, as a stray quote at a field's start gives the same
        notes.append(f"{path}: a quoted field holding tabs runs over several lines, read as one row as pandas reads it "
                     f"(line {', '.join(map(str, joined[:5]))}{' …' if len(joined) > 5 else ''}): a stray quote (\") at "
                     "the start of a field?")
    return items, notes


def _checked(cell: str, images: bool, max_image_pixels: int | None) -> list[tuple]:
    """``(size, problem)`` of each image of an image cell: decoded from base64 and checked, or with
    ``images=False`` only counted (``(None, None)`` each)."""
    values = _as_list(cell.strip())
    if not images:
        return [(None, None)] * len(values)
    out = []
    for value in values:
        data = _decode(value)
        out.append(check_image_bytes(data, max_image_pixels) if data is not None else (None, "not base64"))
    return out


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
        try:
            with open(ref.path, "rb") as f:
                if ref.path not in columns:
                    columns[ref.path] = next(_records(f), (0, 0, []))[2]
                f.seek(ref.chunk)
                fields = next(_records(f), (0, 0, []))[2]
        except (OSError, UnicodeDecodeError, _Unreadable) as exc:
            raise InputError(f"cannot read {ref.path}: {exc}", hint="the file changed since the run started") from exc
        row = dict(zip(columns[ref.path], fields))
        values = _as_list((row.get(ref.column) or "").strip())
        data = _decode(values[ref.index or 0]) if len(values) > (ref.index or 0) else None
        if data is None:
            raise InputError(f"{ref.path}: row {ref.offset} no longer holds image {ref.index or 0}",
                             hint="the file changed since the run started")
        found[ref] = data
    return found
