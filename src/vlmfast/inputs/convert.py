"""Convert other projects' dataset files into vlmfast manifests with ground truth.

Three sources: VLM-R1 (its REC test files — a JSON array of ``{"image", "problem", "solution"}`` with the
box in original-image pixels — and its training JSONL with ``conversations``), ms-swift datasets
(``{"messages", "images", "solution"}``) and R1-V's evaluation lines (``{"image_path", "question",
"ground_truth"}``). Output rows are ours: ``{"id", "image"|"images", "prompt",
"system"?, "solution"?, "scorer"?}``, each ``id`` the one ``--manifest`` gives the record read as it is
(:mod:`vlmfast.inputs.jsonl`). Every bad record is reported at once as ``file:line``.
Standard library only: converting needs no model.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from pathlib import Path

from vlmfast.errors import InputError, UsageError
from vlmfast.inputs.datasets import VLMR1_SCORERS, is_r1v, is_vlmr1, r1v_view, vlmr1_solution
from vlmfast.inputs.records import check_image_marks, image_id, is_base64_image, parse_messages
from vlmfast.inputs.requests import Request, read_manifest
from vlmfast.evaluation.scoring import SCORERS, truth_text

FORMATS = ("vlmr1", "swift", "r1v", "auto")
_URL_PREFIXES = ("http://", "https://", "data:")


def convert_file(path: str, fmt: str = "auto", *, image_root: str | None = None) -> list[dict]:
    """Manifest rows from a VLM-R1, ms-swift or R1-V file (a JSON array or JSONL; detected by content).

    Relative image paths are joined to ``image_root`` when given, else kept as written. ``fmt="auto"``
    decides per record: ``messages`` → swift; ``image_path`` and ``question`` (R1-V's keys, none of ours) → r1v;
    ``problem``/``question``/``conversations`` → vlmr1."""
    if fmt not in FORMATS:
        raise UsageError(f"unknown format {fmt!r}", hint=f"choose one of: {', '.join(FORMATS)}")
    from vlmfast.inputs.datasets import DATASET_SUFFIXES
    from vlmfast.inputs.tsv import is_tsv

    if is_tsv(path) or Path(path).suffix.lower() in DATASET_SUFFIXES:  # read as they are: converting one would
        kind = "a VLMEvalKit TSV" if is_tsv(path) else "a parquet / Arrow dataset"  # list every line as bad JSON
        raise UsageError(f"{path}: {kind} needs no converting", hint=f"give it to infer, sweep or score as it is: --manifest {path}")
    try:
        text = Path(path).read_text(encoding="utf-8-sig")  # a byte-order mark, as --manifest accepts it
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read {path}: {exc}", hint="give a readable UTF-8 JSON or JSONL file") from exc
    records, problems = read_records(text, str(path))
    rows, bad = convert_records(records, fmt, image_root=image_root)
    problems = sorted(problems + bad, key=lambda p: _line_of(p, str(path)))  # in file order, whatever found them
    if problems:
        listing = "\n".join(f"  - {p}" for p in problems[:50])
        more = f"\n  … and {len(problems) - 50} more" if len(problems) > 50 else ""
        raise InputError(f"{len(problems)} bad record(s) in {path}; nothing was converted:\n{listing}{more}",
                         hint="fix or remove those records and convert again", problems=problems)
    if not rows:
        raise InputError(f"{path} holds no records", hint="give a JSON array of objects or one JSON object per line")
    return rows


def _line_of(problem: str, name: str) -> int:
    """The line number of a ``name:line…: what`` problem (0 when it names none)."""
    digits = problem[len(name) + 1:].split(":", 1)[0].split(" ", 1)[0]
    return int(digits) if digits.isdigit() else 0


def read_records(text: str, name: str) -> tuple[list[tuple[str, object]], list[str]]:
    """``(where, record)`` pairs from a JSON array or JSONL text, where is ``name:line``; and problems."""
    if text.lstrip().startswith("["):
        try:
            return _array_records(text, name), []
        except json.JSONDecodeError as exc:
            return [], [f"{name}:{exc.lineno}: invalid JSON ({exc.msg} at column {exc.colno})"]
    records, problems = [], []
    # JSON's line breaks only (as --manifest splits its bytes): str.splitlines also breaks at U+2028, U+0085, …,
    # which a JSON string may hold as they are (json.dumps(..., ensure_ascii=False) writes them so)
    for lineno, line in enumerate(re.split(r"\r\n|\r|\n", text), start=1):
        if not line.strip():
            continue
        try:
            records.append((f"{name}:{lineno}", json.loads(line)))
        except json.JSONDecodeError as exc:
            problems.append(f"{name}:{lineno}: invalid JSON ({exc.msg} at column {exc.colno})")
    return records, problems


def _array_records(text: str, name: str) -> list[tuple[str, object]]:
    # Decode element by element so each record keeps the line it starts on for error messages.
    decoder = json.JSONDecoder()
    pos = _skip_space(text, text.index("[") + 1)
    line, counted = 1, 0
    records = []
    while pos < len(text) and text[pos] != "]":
        line, counted = line + text.count("\n", counted, pos), pos
        record, pos = decoder.raw_decode(text, pos)
        records.append((line, record))
        pos = _skip_space(text, pos)
        if pos < len(text) and text[pos] == ",":
            pos = _skip_space(text, pos + 1)
        elif pos >= len(text) or text[pos] != "]":
            raise json.JSONDecodeError("expected ',' or ']'", text, min(pos, len(text)))
    if pos >= len(text):
        raise json.JSONDecodeError("unterminated array", text, len(text))
    if text[pos + 1:].strip():
        raise json.JSONDecodeError("extra data after the array", text, pos + 1)
    # records that share a line (an array written on one) are told apart by their number in the array
    per_line = Counter(line for line, _ in records)
    return [(f"{name}:{line}" + (f" (record {k + 1})" if per_line[line] > 1 else ""), record)
            for k, (line, record) in enumerate(records)]


def _skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t\r\n":
        pos += 1
    return pos


def convert_records(records: list[tuple[str, object]], fmt: str = "auto", *,
                    image_root: str | None = None) -> tuple[list[dict], list[str]]:
    """Convert ``(where, record)`` pairs; returns the rows and a ``where: what`` problem per bad record."""
    rows, problems = [], []
    seen: dict[str, str] = {}
    by_image: dict[str, int] = {}  # records without an id so far, by first image: ranked as --manifest ranks them
    for index, (where, record) in enumerate(records):
        try:
            if not isinstance(record, dict):
                raise ValueError("record is not a JSON object")
            # --manifest names a line without an id by its first image (and rank; an R1-V line through its view), a
            # VLM-R1 line by its position (vlmr1_view): the converted rows carry the ids the file run as it is gives
            # (vlmfast.inputs.jsonl, whose order of checks this follows)
            view = r1v_view(record) if is_r1v(record) else None if is_vlmr1(record) else record
            named = image_id(view, by_image) if view is not None and view.get("id") is None else None
            kind = fmt if fmt != "auto" else _detect(record)
            if kind == "vlmr1":
                row = _from_vlmr1(record, index, image_root)
            else:
                row = _from_swift(record, index, image_root, named) if kind == "swift" else _from_r1v(record, index, image_root, named)
        except ValueError as exc:
            problems.append(f"{where}: {exc}")
            continue
        if row["id"] in seen:
            problems.append(f"{where}: duplicate id {row['id']!r} (first at {seen[row['id']]})")
            continue
        seen[row["id"]] = where
        rows.append(row)
    return rows, problems


def _detect(record: dict) -> str:
    if "messages" in record:
        return "swift"
    if is_r1v(record):
        return "r1v"
    if any(k in record for k in ("problem", "question", "conversations")):
        return "vlmr1"
    raise ValueError('cannot tell the format: expected VLM-R1 "problem"/"conversations", ms-swift "messages" or R1-V '
                     '"image_path" and "question"')


def _from_vlmr1(record: dict, index: int, image_root: str | None) -> dict:
    images = _images(record, image_root)
    turns = record.get("conversations") if isinstance(record.get("conversations"), list) else []
    prompt = record.get("problem", record.get("question"))
    if prompt is None and turns and isinstance(turns[0], dict):
        prompt = turns[0].get("value")  # VLM-R1's loader takes the first turn as the problem
    if not isinstance(prompt, str) or not prompt.replace("<image>", "").strip():
        raise ValueError('no question: give "problem" (or "question", or a first "conversations" turn)')
    truth = record["solution"] if record.get("solution") is not None else record.get("answer")
    if truth is None and len(turns) > 1 and isinstance(turns[1], dict) and turns[1].get("value") is not None:
        truth = vlmr1_solution(turns[1]["value"])  # what VLM-R1's loader hands its reward functions
    # VLM-R1's loader only drops the marks (grpo_jsonl.py: .replace('<image>', '')): the question keeps its
    # whitespace, as --manifest reads the same line (vlmr1_row)
    row = _row(record, index, images, prompt, strip=False)
    scorer = record.get("scorer") or VLMR1_SCORERS.get(record.get("accu_reward_method"))
    return _with_truth(row, truth, scorer, box=scorer in (None, *_BOX_SCORERS))  # a REC file's solution is its box


def _from_swift(record: dict, index: int, image_root: str | None, named: str | None) -> dict:
    prompt, system, reply = parse_messages(record.get("messages"), record.get("system"))
    if not prompt:
        raise ValueError("the last user turn has no text")
    truth = record["solution"] if record.get("solution") is not None else record.get("answer")
    row = _row(record, index, _images(record, image_root), prompt, named=named)
    if system:
        row["system"] = system
    return _with_truth(row, reply if truth is None else truth, record.get("scorer"), box=record.get("scorer") in _BOX_SCORERS)


def _from_r1v(record: dict, index: int, image_root: str | None, named: str | None) -> dict:
    if not is_r1v(record):
        raise ValueError('not an R1-V line: give "image_path" and "question" (and none of "image", "images", "prompt", '
                         '"messages")')
    view = r1v_view(record)  # as --manifest reads the line
    prompt, images = view["prompt"], _images(view, image_root)
    if not isinstance(prompt, str) or not prompt.replace("<image>", "").strip():
        raise ValueError('no question: give "question" a text')
    check_image_marks([prompt], len(images))  # --manifest refuses a question whose marks are not one per image
    # the question as --manifest reads it (inputs/jsonl.py): its marks dropped, stripped only where it held one
    row = _row(view, index, images, prompt, strip="<image>" in prompt, named=named)
    if isinstance(view.get("system"), str) and view["system"]:
        row["system"] = view["system"]
    return _with_truth(row, view.get("solution"), view.get("scorer"), box=view.get("scorer") in _BOX_SCORERS)


def _images(record: dict, image_root: str | None) -> list[str]:
    value = record.get("images", record.get("image"))
    value = [value] if isinstance(value, (str, dict)) else value
    if not isinstance(value, list) or not value:
        raise ValueError('no image: give "image": "path" or "images": ["path", ...]')
    paths = []
    for item in value:
        path = item.get("path") if isinstance(item, dict) else item  # ms-swift also writes {"path": ...}
        if not isinstance(path, str) or not path or is_base64_image(path):
            raise ValueError(f"image {item!r:.60} is not a path" + (f" but base64 data ({len(path):,} characters): write it "
                                                                    "to a file first" if isinstance(path, str) and path else ""))
        relative = not (os.path.isabs(path) or path.startswith(_URL_PREFIXES))
        paths.append(os.path.join(image_root, path) if image_root and relative else path)
    return paths


def _row(record: dict, index: int, images: list[str], prompt: str, strip: bool = True, named: str | None = None) -> dict:
    """``named``: the id of a record without one (:func:`vlmfast.inputs.records.image_id`); None: ``NNNNN_<image
    stem>``, the position in the file and the image's name, as --manifest names a VLM-R1 line (vlmr1_view)."""
    rid = record.get("id")
    if rid is None:
        rid = named if named is not None else f"{index:05d}_{Path(images[0]).stem}"
    elif not isinstance(rid, (str, int)) or isinstance(rid, bool):
        raise ValueError('"id" must be a string or an integer')
    row = {"id": str(rid)}
    row.update({"image": images[0]} if len(images) == 1 else {"images": images})
    row["prompt"] = prompt.replace("<image>", "").strip() if strip else prompt.replace("<image>", "")
    return row


_BOX_SCORERS = ("bbox", "vlm-r1-rec")


def _with_truth(row: dict, truth, scorer: str | None, box: bool) -> dict:
    """``truth`` is written as the source holds it: a trainer's reward function (``--reward``) is handed the
    manifest's value as written, and would score a stripped or decoded one differently (ms-swift's ORMs match
    against the text, VLM-R1's rewards find the answer tags in it); the built-in scorers read inside."""
    if scorer is not None and scorer not in SCORERS:
        raise ValueError(f"unknown scorer {scorer!r} (choose one of: {', '.join(SCORERS)})")
    if box and isinstance(truth, list) and truth and all(isinstance(v, (int, float)) for v in truth):
        _check_box(truth)  # a box (``box``: a REC record's, or one a box scorer reads), given as a JSON list; a
        # text such as "[4, 3, 2, 1]", or an ms-swift list that names no box scorer, may be any answer
    if truth_text(truth) is None:
        return row
    row["solution"] = truth  # a box needs no scorer written: auto picks bbox by its shape, and --scorer still applies
    if scorer is not None and scorer != "auto":
        row["scorer"] = scorer
    return row


def _check_box(values: list) -> None:
    if len(values) != 4:
        raise ValueError(f"solution has {len(values)} numbers; a box is [x1, y1, x2, y2]")
    x1, y1, x2, y2 = values
    if x2 <= x1 or y2 <= y1:
        raise ValueError(f"solution box {values} is empty or reversed; expected [x1, y1, x2, y2] with x2 > x1, y2 > y1")


def rebase_images(rows: list[dict], source: str, out_path: str) -> list[dict]:
    """Rows whose relative image paths name the same files from ``out_path``'s folder: a manifest's relative
    paths are read against its own folder, and the source's were against the source's folder (where the file
    is there; else, as a run reads them, against the working directory)."""
    here, there = Path(source).parent, Path(out_path).parent
    if here.resolve() == there.resolve():
        return rows

    def moved(path: str) -> str:
        if os.path.isabs(path) or path.startswith(_URL_PREFIXES):
            return path
        found = here / path if (here / path).exists() or not os.path.exists(path) else Path(path)
        return os.path.relpath(os.path.abspath(found), os.path.abspath(there))

    out = []
    for row in rows:
        row = dict(row)
        if "image" in row:
            row["image"] = moved(row["image"])
        else:
            row["images"] = [moved(p) for p in row["images"]]
        out.append(row)
    return out


def write_manifest(rows: list[dict], out_path: str) -> Path:
    """Write rows as JSONL (UTF-8, one record a line). Written whole or not at all."""
    from vlmfast.files import atomic_write

    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(out, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode("utf-8"))  # a unique temp file
    return out


def read_truths(manifest: str, keys=None, image_root: str | None = None) -> dict[str, tuple[object, str | None]]:
    """id → (truth, scorer) for every record of a manifest, read exactly as a run reads it (same ids,
    same ground-truth fields; ``keys``: a dataset's columns, as the run's ``--prompt-key`` … gave them)."""
    return {r.id: (r.truth, r.scorer) for r in _good_requests(manifest, keys, image_root)}


def _good_requests(manifest: str, keys=None, image_root: str | None = None, skip_bad: bool = False) -> list[Request]:
    # prompts and images do not matter for scoring: a TSV's or dataset's images are not decoded or checked
    items, _ = read_manifest(manifest, default_prompt="-", keys=keys, images=False, image_root=image_root)
    bad = [p for r in items if not isinstance(r, Request) for p in r.problems]
    if bad and not skip_bad:
        raise InputError(f"{len(bad)} bad manifest record(s):\n" + "\n".join(f"  - {p}" for p in bad[:50]),
                         hint=f"fix them (scorers are: {', '.join(SCORERS)})", problems=[str(p) for p in bad])
    return [r for r in items if isinstance(r, Request)]


def truth_fields(manifest: str, keys=None) -> tuple[str, str, str]:
    """(the ground-truth fields the manifest reader looks for, the fields the manifest's first record has,
    a hint) for a manifest none of whose records gave a ground truth."""
    from vlmfast.inputs.datasets import ANSWER_KEYS, R1V_KEYS, is_dataset
    from vlmfast.inputs.embedded import column_names, dataset_parts

    if is_dataset(manifest):
        given = keys.answer if keys is not None and keys.answer else None
        looked = f"column {given}" if given else "the columns " + ", ".join(ANSWER_KEYS)
        found = ", ".join(column_names(dataset_parts(manifest)[0]))
        return looked, found, "name the ground-truth column with --answer-key COLUMN"
    records, _ = read_records(Path(manifest).read_text(encoding="utf-8", errors="replace"), manifest)
    first = next((r for _, r in records if isinstance(r, dict)), {})
    looked = '"solution", "answer", an assistant turn after the last user turn of "messages", R1-V\'s "ground_truth"'
    hint = 'give each line its ground truth as "solution" (e.g. "solution": "B")'
    if "conversations" in first:
        hint = 'VLM-R1 lines carry their solution as the second "conversations" turn: add it to each line'
        looked = 'the second "conversations" turn (VLM-R1)'

    elif set(first) & (R1V_KEYS - {"ground_truth"}):
        hint = 'R1-V lines carry their truth as "ground_truth": add it to each line'
    elif {"text", "finish_reason", "n_new_tokens"} <= set(first):  # a vlmfast results file, not a manifest
        hint = (f"{manifest} is a vlmfast results file (its rows have \"text\", \"finish_reason\"), not a manifest: give "
                "--manifest the file of requests with their ground truth that the run was made from")
    return looked, ", ".join(f'"{k}"' for k in first) or "no fields", hint


def read_reward_truths(manifest: str, keys=None, image_root: str | None = None, skip_bad: bool = False) -> dict[str, dict]:
    """id → what a trainer's reward function is handed of each manifest record: ``manifest_truth`` (the
    ground truth byte for byte as the line holds it), ``record`` (the line itself), ``data_source`` and
    ``ground_truth``/``scorer`` as :func:`read_truths` gives them. Same records, same ids as a run (its
    ``image_root`` too: VLM-R1's rewards get the image paths). ``skip_bad``: bad records left out, not raised."""
    return {r.id: r.truth_record() for r in _good_requests(manifest, keys, image_root, skip_bad)}

