"""JSONL manifests: one JSON object per line — vlmfast's own keys, ms-swift's ``messages``, TRL's
conversational ``prompt``, R1-V's and VLM-R1's evaluation lines — read into requests and bad lines, in
file order, before any model is loaded."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from vlmfast.errors import InputError
from vlmfast.evaluation.scoring import SCORERS, truth_text
from vlmfast.inputs.records import (BadInput, Problem, Request, check_image_marks, content_text, image_id,
                                    is_base64_image, parse_messages, resolve_relative)

# The image placeholder of LLaVA-style data (ms-swift, VLM-R1, EasyR1, verl): in every manifest format it marks
# where an image goes, never text; vlmfast removes it and puts the request's images before the text.
IMAGE_MARK = "<image>"

# Manifest keys we understand; anything else is ignored (and reported once).
MANIFEST_KEYS = frozenset({"id", "image", "images", "prompt", "system", "messages", "solution", "answer", "scorer",
                           "data_source", "extra_info"})


def read_jsonl(path: str, default_prompt: str | None, image_root: str | None = None) -> tuple[list[Request | BadInput], list[str]]:
    """Every line of the JSONL manifest ``path`` as a request or a bad line (with what is wrong, where);
    warnings (fields ignored, ids given by rank). Relative image paths resolve against ``image_root`` (default:
    the manifest's directory) first, then the working directory."""
    from vlmfast.inputs.datasets import is_r1v, is_vlmr1, r1v_view, vlmr1_answer, vlmr1_row, vlmr1_view

    try:
        raw = Path(path).read_bytes().removeprefix(b"\xef\xbb\xbf")  # a byte-order mark, as editors on Windows write
    except OSError as exc:
        raise InputError(f"cannot read manifest {path}: {exc}", hint="check the path and permissions") from exc
    _refuse_json_array(raw, path)
    base = Path(image_root) if image_root else Path(path).parent
    items: list[Request | BadInput] = []
    unknown: set[str] = set()
    decoded = 0  # JSON values read so far: a VLM-R1 line without an id is named by its position, as convert names it
    # a line without an id is named by its first image; another line asking about the same image (an R1-V or
    # ms-swift file asking several questions of one image) by the image and its rank: IMAGE#2, IMAGE#3, …
    by_image: dict[str, int] = {}
    name = Path(path).name
    resolved: dict[str, str] = {}  # each image path as written → resolved, looked up once per read (not once a line)
    for lineno, line in enumerate(raw.splitlines(), start=1):
        where = f"{path}:{lineno}"
        # an unreadable line's id: the file's name and line, the same however the path was spelled (a resume
        # from another directory finds its error row)
        line_id = f"{name}:{lineno}"
        if not line.strip():
            continue
        try:
            record = json.loads(line.decode("utf-8"))
        except UnicodeDecodeError:
            items.append(_bad_line(where, "line is not valid UTF-8", line_id))
            continue
        except json.JSONDecodeError as exc:
            items.append(_bad_line(where, f"invalid JSON ({exc.msg} at column {exc.colno})", line_id))
            continue
        decoded += 1
        if not isinstance(record, dict):
            items.append(_bad_line(where, "record is not a JSON object", line_id))
            continue
        line, written = record, None
        if is_r1v(record):  # R1-V's evaluation lines: read through our keys, handed to rewards as they are
            record = r1v_view(record)
        elif is_vlmr1(record):  # VLM-R1's lines: rewards get the row its loader makes, scorers our keys
            line, written = vlmr1_row(record, base), vlmr1_answer(record)
            record = vlmr1_view(line, decoded - 1)
        else:
            unknown.update(set(record) - MANIFEST_KEYS)
        rid = record.get("id")
        if rid is None:  # ranked whether or not the line is good: mending a bad line moves no other line's id
            rid = image_id(record, by_image)
        try:
            request = _record_to_request(record, where, base, default_prompt, decoded - 1, resolved)
            request = request if rid is None or request.id == str(rid) else dataclasses.replace(request, id=str(rid))
            items.append(request if line is record else dataclasses.replace(request, record=line, written_truth=written))
        except ValueError as exc:
            items.append(_bad_line(where, str(exc), str(rid if rid is not None else line_id)))
    warnings = [f"{path}: ignored unknown manifest fields: {', '.join(sorted(unknown))}"] if unknown else []
    if shared := [image for image, n in by_image.items() if n > 1]:
        warnings.append(f"{path}: {len(shared)} image(s) asked about by several lines without an \"id\" (e.g. {shared[0]}): "
                        f"the later lines' ids are the image and their rank ({shared[0]}#2, …)")
    if not items:
        raise InputError(f"manifest {path} holds no records", hint="write one JSON object per line")
    return items, warnings


def _refuse_json_array(raw: bytes, path: str) -> None:
    """A file holding one JSON array (VLM-R1's REC files) is not a manifest of one JSON object per line:
    one error that says so and how to convert it, not an error for each of its lines."""
    if not raw.lstrip().startswith(b"["):
        return
    first = raw.lstrip().split(b"\n", 1)[0]
    try:
        whole = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        whole = None
        try:
            json.loads(first.decode("utf-8"))
            return  # a line of its own: said with that line
        except (UnicodeDecodeError, json.JSONDecodeError):
            pass
    if whole is None or isinstance(whole, list):
        out = Path(path).with_suffix(".jsonl").name
        raise InputError(f"{path} is a JSON array{'' if whole is not None else ' (that does not parse)'}, not a manifest "
                         "(one JSON object per line)",
                         hint=f"convert it first: vlmfast convert {path} --out {out} (add --image-root DIR when its "
                              "image paths are under another folder), then give --manifest that file")


def _bad_line(where: str, what: str, rid: str) -> BadInput:
    return BadInput(id=rid, problems=(Problem(where, what),))


def _record_to_request(record: dict, where: str, base: Path, default_prompt: str | None,
                       position: int | None = None, resolved: dict[str, str] | None = None) -> Request:
    """One record as a request (a ValueError says what is wrong with it). ``resolved``: image paths already
    resolved against ``base`` in this read, added to as more are."""
    resolved = {} if resolved is None else resolved
    system = record.get("system")
    prompt = record.get("prompt")
    truth = record["solution"] if record.get("solution") is not None else record.get("answer")
    # ms-swift's "messages", TRL's conversational "prompt" (a list of turns): the last user turn is the prompt
    turns = record["messages"] if "messages" in record else prompt if isinstance(prompt, list) else None
    if turns is not None:
        prompt, system, reply = parse_messages(turns, system)
        truth = reply if truth is None else truth
    if "image" in record and "images" in record:
        raise ValueError('give "image" or "images", not both')
    images = record.get("images", [record["image"]] if "image" in record else None)
    if isinstance(images, (str, dict)):
        images = [images]
    if isinstance(images, list):  # ms-swift also writes {"path": ...}
        images = [i.get("path") if isinstance(i, dict) else i for i in images]
    if not images or not all(isinstance(i, str) and i for i in images):
        raise ValueError('no image: give "image": "path" or "images": ["path", ...]')
    if (data := next((i for i in images if is_base64_image(i)), None)) is not None:  # not echoed: it runs to megabytes
        raise ValueError(f"an image is base64 data ({len(data):,} characters), not a path: images are read from local "
                         "files (write it to a file first, or embed it in a parquet dataset)")
    texts = [content_text(m.get("content")) for m in turns if isinstance(m, dict)] if isinstance(turns, list) else []
    check_image_marks([record.get("prompt")] + texts, len(images), fewer_ok="messages" in record)  # marks are dropped
    if isinstance(prompt, str) and IMAGE_MARK in prompt:  # the image's place, as in every format read: images go first
        prompt = prompt.replace(IMAGE_MARK, "").strip()  # a prompt without a mark is kept as written
    if not prompt and isinstance(record.get("problem"), str):  # --prompt would ask every line the same question
        raise ValueError(f'no "prompt": the line holds "problem", a trainer\'s dataset line (EasyR1, VLM-R1) whose question it '
                         f'is; convert the file first: vlmfast convert {(f := where.rsplit(":", 1)[0])} --out {Path(f).stem}.manifest.jsonl')
    prompt = prompt if prompt else default_prompt
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValueError('no prompt: give "prompt" in the record, or --prompt / --prompt-file for all')
    scorer = record.get("scorer")
    if scorer is not None and scorer not in SCORERS:
        raise ValueError(f"unknown scorer {scorer!r}: use one of {', '.join(SCORERS)}")
    # without an id, the first image as the record writes it: the same id however the manifest's path is spelled
    # (a resume from another directory, a score run elsewhere)
    rid = record.get("id", images[0])
    images = [resolved[i] if i in resolved else resolved.setdefault(i, resolve_relative(i, base)) for i in images]
    if not isinstance(rid, (str, int)) or isinstance(rid, bool):
        raise ValueError('"id" must be a string or an integer')
    source = record.get("data_source")
    return Request(id=str(rid), images=tuple(images), prompt=prompt, system=system, truth=truth_text(truth),
                   scorer=scorer, data_source=str(source) if source is not None else None, manifest_truth=truth,
                   record=record, source=where, position=position)
