"""The data trainers validate on, read as it is: EasyR1 and verl parquet / ``save_to_disk`` datasets
(images embedded as bytes) and R1-V's JSONL, each row turned into the :class:`Request` a vlmfast JSONL
line would give.

Which columns (``--prompt-key`` / ``--answer-key`` / ``--image-key``; a dotted name reaches into a struct,
e.g. ``reward_model.ground_truth``). A key given must exist; left out, the first column present wins:

- prompt: ``problem`` (EasyR1's default), then ``prompt`` (verl's: chat messages — the last user turn's
  text, a system turn as the system prompt — or a string);
- answer: ``answer`` (EasyR1), then ``reward_model.ground_truth`` (verl), then ``solution``;
- images: ``images``, then ``image``.

So EasyR1's columns win where a file holds both layouts. ``<image>`` placeholders are removed from the
prompt and the images go before the text (vlmfast's chat layout; EasyR1 and verl put an image where its
placeholder is, the same prompt when the placeholders lead, as in geometry3k). The id is the ``id``
column, else ``extra_info.index``, else the row number (shards counted as one table). ``data_source``,
``scorer`` and ``system`` columns are read as a JSONL line's; every column travels with the request
(``Request.record``: TRL rewards get each as a keyword, verl's ``extra_info`` its own), the image column
holding the images' labels instead of their bytes. Embedded images get a stable label
(``FILE#row=N/image=K``, the results' ``images``) and are decoded only when their batch is prepared
(:mod:`vlmfast.inputs.embedded`); image paths resolve against the file's folder, then the working folder.

R1-V's JSONL (``{"image_path", "question", "ground_truth"}``) is recognised by its keys.
"""

from __future__ import annotations

import dataclasses
import io
from dataclasses import dataclass
from pathlib import Path

from vlmfast.errors import InputError, UsageError
from vlmfast.evaluation.scoring import SCORERS, truth_text
from vlmfast.inputs.embedded import (EmbeddedImage, Part, column_names, dataset_parts, fetch_bytes, image_entries,
                                     image_label, key_values, record_batches)
from vlmfast.inputs.records import (BadInput, Problem, Request, check_image_bytes, check_image_marks, check_images,
                                   content_text, parse_messages, resolve_relative)

DATASET_SUFFIXES = (".parquet", ".arrow")
PROMPT_KEYS = ("problem", "prompt")
ANSWER_KEYS = ("answer", "reward_model.ground_truth", "solution")
IMAGE_KEYS = ("images", "image")
R1V_KEYS = frozenset({"image_path", "question", "ground_truth"})


@dataclass(frozen=True)
class DatasetKeys:
    """The columns to read (None: the defaults above, first present wins)."""

    prompt: str | None = None
    answer: str | None = None
    image: str | None = None

    @property
    def given(self) -> bool:
        return any(k is not None for k in (self.prompt, self.answer, self.image))


@dataclass(frozen=True)
class Columns:
    """The columns a dataset's rows are read from (None: the dataset has none)."""

    prompt: str | None
    answer: str | None
    image: str | None


def is_dataset(path: str) -> bool:
    """Whether ``--manifest PATH`` is a parquet / Arrow dataset rather than a JSONL file."""
    p = Path(path)
    return p.is_dir() or p.suffix in DATASET_SUFFIXES


def pick_columns(available: list[str], keys: DatasetKeys, where: str, nested: dict[str, list[str]] | None = None) -> Columns:
    """The columns to read, checked against ``available`` (top-level names; ``nested`` maps a struct
    column to its fields, for dotted keys). A key given that is not there is a UsageError naming them."""
    nested = nested or {}
    names = set(available) | {f"{top}.{sub}" for top, subs in nested.items() for sub in subs}

    def choose(given: str | None, defaults: tuple[str, ...], flag: str) -> str | None:
        if given is None:
            return next((k for k in defaults if k in names), None)
        if given not in names:
            raise UsageError(f"{flag} {given}: {where} has no such column (columns: {', '.join(sorted(names))})",
                             hint=f"give {flag} one of those columns")
        return given

    return Columns(choose(keys.prompt, PROMPT_KEYS, "--prompt-key"), choose(keys.answer, ANSWER_KEYS, "--answer-key"),
                   choose(keys.image, IMAGE_KEYS, "--image-key"))


def read_dataset(path: str, default_prompt: str | None, keys: DatasetKeys | None = None,
                 max_image_pixels: int | None = None, *, images: bool = True,
                 image_root: str | None = None) -> tuple[list[Request | BadInput], list[str]]:
    """Requests (and bad rows) of a parquet file, a folder of parquet shards or a ``save_to_disk`` folder,
    in row order, one record batch in memory at a time. Embedded images are checked (header, pixel limit)
    here and kept as :class:`EmbeddedImage` references; their requests come with ``image_sizes`` set.
    ``images=False``: images are neither decoded nor checked (reading ground truths needs ids and answers).
    Relative image paths are read under ``image_root`` (EasyR1's ``data.image_dir``), else the file's folder."""
    parts = dataset_parts(path)
    available, nested = _schema(parts[0])
    columns = pick_columns(available, keys or DatasetKeys(), path, nested)
    if columns.image is None:
        raise UsageError(f"{path} has no image column (columns: {', '.join(column_names(parts[0]))})",
                         hint="give --image-key COLUMN")
    if columns.prompt is None and not (default_prompt and default_prompt.strip()):  # not a problem of each row's
        raise UsageError(f"{path} has no prompt column ({' or '.join(PROMPT_KEYS)}; columns: "
                         f"{', '.join(column_names(parts[0]))})",
                         hint="give --prompt-key COLUMN (or --prompt for one question for every row)")
    items: list[Request | BadInput] = []
    number = 0  # the row number across shards: the id of a row without one
    for part in parts:
        file_row = 0
        for chunk, start, batch in record_batches(part):
            names = batch.schema.names
            rows = batch.select([n for n in names if n != columns.image]).to_pylist()  # a dotted key's bytes: in its struct
            pictures = key_values(batch, columns.image)
            for i, row in enumerate(rows):
                value = pictures[i].as_py() if pictures is not None else None  # one row's images at a time
                where = f"{part.path}#row={file_row}"
                ref = (part, chunk, start + i, file_row, isinstance(value, list))
                items.append(_row_request(row, value, where, ref, number, columns, default_prompt, max_image_pixels,
                                          check=images, image_root=image_root))
                file_row += 1
                number += 1
    if not items:
        raise InputError(f"manifest {path} holds no rows", hint="give a dataset with at least one row")
    return _ids_by_source(items), []


def _ids_by_source(items: list) -> list:
    """verl's rows are named by ``extra_info.index``, which restarts for each dataset a file joins: where two
    rows share one, each is named ``data_source:index`` (an explicit ``id`` column repeated stays a duplicate)."""
    from collections import Counter

    seen = Counter(item.id for item in items)

    def renamed(item):
        request = item if isinstance(item, Request) else getattr(item, "request", None)
        record = getattr(request, "record", None) or {}
        if seen[item.id] < 2 or "id" in record or request is None or not request.data_source:
            return item
        return dataclasses.replace(item, id=f"{request.data_source}:{item.id}")

    return [renamed(item) for item in items]


def _schema(part: Part) -> tuple[list[str], dict[str, list[str]]]:
    """Top-level columns and each struct column's fields."""
    from vlmfast.inputs.embedded import require_pyarrow

    pa = require_pyarrow()
    try:
        if part.kind == "parquet":
            schema = pa.parquet.ParquetFile(part.path).schema_arrow
        else:
            with pa.memory_map(part.path) as source:
                schema = pa.ipc.open_stream(source).schema
    except (OSError, pa.ArrowException) as exc:  # a truncated or foreign file: said before any model loads
        raise InputError(f"cannot read {part.path}: {exc}",
                         hint="give a parquet file or a datasets save_to_disk folder (Arrow IPC stream files)") from exc
    nested = {f.name: [s.name for s in f.type] for f in schema if pa.types.is_struct(f.type)}
    return list(schema.names), nested


def _row_request(row: dict, value, where: str, ref: tuple, number: int, columns: Columns,
                 default_prompt: str | None, max_image_pixels: int | None, *, check: bool = True,
                 image_root: str | None = None) -> Request | BadInput:
    """One dataset row → a request (or the row's problems), its images checked (``check``) or not."""
    part, chunk, offset, file_row, is_list = ref
    try:
        fields = row_fields(row, columns, default_prompt, number)
    except ValueError as exc:
        return BadInput(id=str(row.get("id", where)), problems=(Problem(where, str(exc)),))
    entries = image_entries(value)
    raw = dig(row, columns.prompt) if columns.prompt else None
    try:  # EasyR1 and verl give an image slot per mark: a row whose marks and images disagree never trained
        check_image_marks([content_text(m.get("content")) for m in raw if isinstance(m, dict)] if isinstance(raw, list)
                          else [raw], len(entries), fewer_ok=columns.prompt == "messages")  # ms-swift adds marks
    except ValueError as exc:
        return BadInput(id=fields["id"], problems=(Problem(where, str(exc)),))
    if not entries and check:
        return BadInput(id=fields["id"], problems=(Problem(where, f'no image in column "{columns.image}"'),))
    base = Path(image_root) if image_root else Path(part.path).parent
    labels, data, sizes, problems = [], [], [], []
    for k, entry in enumerate(entries):
        if isinstance(entry, bytes):
            label = image_label(part, file_row, k)
            data.append(EmbeddedImage(part.path, part.kind, chunk, offset, columns.image, k if is_list else None))
            size, problem = check_image_bytes(entry, max_image_pixels) if check else (None, None)
        elif isinstance(entry, str):
            label = resolve_relative(entry, base)
            data.append(None)
            found, failed = check_images([label], max_image_pixels) if check else ({}, {})
            size, problem = found.get(label), failed.get(label)
        else:
            label, size = image_label(part, file_row, k), None
            problem = "neither image bytes nor a path" if check else None
            data.append(None)
        labels.append(label)
        sizes.append(size)
        if problem is not None:
            problems.append(Problem(label, problem))
    record = _put(row, columns.image, labels if is_list or not labels else labels[0])  # labels, not bytes: rows stay small
    request = Request(id=fields["id"], images=tuple(labels), prompt=fields["prompt"], system=fields["system"],
                      truth=truth_text(fields["truth"]), scorer=fields["scorer"], data_source=fields["data_source"],
                      manifest_truth=fields["truth"], record=record, source=where,
                      image_data=tuple(data) if any(d is not None for d in data) else None)
    if problems:
        return BadInput(id=request.id, problems=tuple(problems), request=request)
    return dataclasses.replace(request, image_sizes=tuple(sizes)) if check else request


def _put(row: dict, key: str, value) -> dict:
    """``row`` with ``key`` set to ``value``; a dotted key's value set inside (copies of) its structs."""
    if key in row or "." not in key:
        return {**row, key: value}
    top, rest = key.split(".", 1)
    return {**row, top: _put(row[top] if isinstance(row.get(top), dict) else {}, rest, value)}


def row_fields(row: dict, columns: Columns, default_prompt: str | None, number: int) -> dict:
    """id, prompt, system, truth (untouched), scorer and data_source of a row; ValueError when unusable."""
    system = row.get("system") if isinstance(row.get("system"), str) else None
    raw = dig(row, columns.prompt) if columns.prompt else None
    reply = None
    if isinstance(raw, list):  # verl: chat messages
        raw, system, reply = parse_messages(raw, system)
    prompt = raw.replace("<image>", "").strip() if isinstance(raw, str) else None
    if not prompt:
        prompt = default_prompt
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValueError(f'no prompt: column "{columns.prompt}" is empty or missing (--prompt-key picks another; '
                         "--prompt gives one for all)")
    truth = dig(row, columns.answer) if columns.answer else None
    truth = reply if truth is None else truth
    scorer = row.get("scorer")
    if scorer is not None and scorer not in SCORERS:
        raise ValueError(f"unknown scorer {scorer!r}: use one of {', '.join(SCORERS)}")
    rid = row.get("id")
    if rid is None:
        rid = dig(row, "extra_info.index")
    if rid is None:
        rid = number
    if not isinstance(rid, (str, int)) or isinstance(rid, bool):
        raise ValueError('"id" must be a string or an integer')
    source = row.get("data_source")
    return {"id": str(rid), "prompt": prompt, "system": system, "truth": truth, "scorer": scorer,
            "data_source": str(source) if source is not None else None}


def dig(row: dict, key: str):
    """``row[key]``, a dotted key reaching into nested dicts (``reward_model.ground_truth``); None if absent."""
    if key in row:
        return row[key]
    value = row
    for name in key.split("."):
        if not isinstance(value, dict) or name not in value:
            return None
        value = value[name]
    return value


def load_images(requests) -> dict[tuple[str, int], object]:
    """``(request id, image position) → PIL image`` for every embedded image of ``requests`` (decoded from
    bytes read just now; nothing written to disk). Path images are not in it."""
    refs = [d for r in requests for d in (getattr(r, "image_data", None) or ()) if d is not None]
    if not refs:
        return {}
    found = fetch_bytes([d for d in refs if d.kind != "tsv"])
    if any(d.kind == "tsv" for d in refs):  # VLMEvalKit TSV: base64 in a row read again by its byte offset
        from vlmfast.inputs.tsv import fetch_tsv_bytes

        found.update(fetch_tsv_bytes([d for d in refs if d.kind == "tsv"]))
    return {(r.id, k): _decoded(found[d], d.kind) for r in requests
            for k, d in enumerate(getattr(r, "image_data", None) or ()) if d is not None}


def _decoded(data: bytes, kind: str):
    """The PIL image of embedded bytes. A TSV's image as VLMEvalKit's ``decode_base64_to_image`` gives it
    (vlmeval/smp/vlm.py at e8e78f05): RGBA, LA and palette images converted to RGB, which drops the alpha
    (the colour under a transparent pixel, often black), before the model's loader sees the file it writes —
    qwen-vl-utils would lay a transparent pixel on white."""
    from PIL import Image

    image = Image.open(io.BytesIO(data))
    return image.convert("RGB") if kind == "tsv" and image.mode in ("RGBA", "P", "LA") else image


# -- EasyR1's format prompt -------------------------------------------------------------------------------
def format_prompt(path: str):
    """EasyR1's ``data.format_prompt``: a Jinja file rendered with ``content`` = the question (its
    ``math.jinja``, ``r1v.jinja``); returns the function that renders one prompt."""
    try:
        from jinja2 import Template, TemplateError
    except ImportError:
        raise UsageError("--format-prompt needs jinja2", hint='pip install "jinja2>=3"') from None
    from jinja2 import Environment, meta

    try:
        text = Path(path).read_text(encoding="utf-8").strip()  # EasyR1 strips the file too
        template, names = Template(text), meta.find_undeclared_variables(Environment().parse(text))
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read --format-prompt {path}: {exc}", hint="give a readable UTF-8 Jinja file") from exc
    except TemplateError as exc:
        raise InputError(f"--format-prompt {path} is not a Jinja template: {exc}", hint="fix the template") from exc
    if "content" not in names:  # every prompt would be the template alone, the question dropped (or empty)
        raise InputError(f"--format-prompt {path} never uses {{{{ content }}}}, the question: every prompt would be "
                         + (repr(text[:60]) if text else "empty"),
                         hint="put {{ content }} where the question goes, as EasyR1's math.jinja and r1v.jinja do")
    return lambda prompt: template.render(content=prompt)


# -- R1-V ---------------------------------------------------------------------------------------------------
def is_r1v(record: dict) -> bool:
    """An R1-V evaluation line: ``image_path`` and ``question`` (and ``ground_truth``), none of ours."""
    return {"image_path", "question"} <= set(record) and not ({"image", "images", "prompt", "messages"} & set(record))


def r1v_view(record: dict) -> dict:
    """An R1-V line in vlmfast's manifest keys (the line itself still travels as the record)."""
    path = record["image_path"]
    view = {"images" if isinstance(path, list) else "image": path, "prompt": record["question"]}
    if "ground_truth" in record:
        view["solution"] = record["ground_truth"]
    for key in ("id", "system", "scorer", "data_source", "extra_info"):
        if key in record:
            view[key] = record[key]
    return view


# -- VLM-R1 -------------------------------------------------------------------------------------------------
# VLM-R1 names a per-record reward ("accu_reward_method"); the ones with a scorer of ours.
VLMR1_SCORERS = {"mcq": "choice"}


def is_vlmr1(record: dict) -> bool:
    """A line of VLM-R1's training / evaluation JSONL (its ``grpo_jsonl.py``): ``conversations`` holding the
    question, then the solution; none of our prompt keys."""
    return isinstance(record.get("conversations"), list) and not ({"prompt", "messages"} & set(record))


def vlmr1_row(record: dict, base: Path) -> dict:
    """The row VLM-R1's loader makes of ``record`` (``grpo_jsonl.py`` ``main`` and ``make_conversation_from_jsonl``):
    ``image`` becomes ``image_path`` (a list; relative paths against the manifest's folder, where the trainer
    joins its ``--image_folders``), the first turn without ``<image>`` is ``problem``, the second turn with its
    answer tags stripped is re-wrapped as ``solution`` = ``"<answer> … </answer>"``, and ``accu_reward_method``
    defaults to ``"default"``; every other field as it is. Reward functions are handed exactly these columns."""
    row = {k: v for k, v in record.items() if k not in ("image", "conversations")}
    image = record.get("image")
    if isinstance(image, (str, list)):
        row["image_path"] = [resolve_relative(i, base) if isinstance(i, str) else i
                             for i in ([image] if isinstance(image, str) else image)]
    turns = record["conversations"]
    first = turns[0].get("value") if turns and isinstance(turns[0], dict) else None
    if isinstance(first, str):
        row["problem"] = first.replace("<image>", "")
    second = turns[1].get("value") if len(turns) > 1 and isinstance(turns[1], dict) else None
    if second is not None:
        row["solution"] = vlmr1_solution(second)
    row["accu_reward_method"] = record.get("accu_reward_method", "default")
    return row


def vlmr1_answer(record: dict):
    """A VLM-R1 ``conversations`` line's answer as the line writes it (its second turn), None without one."""
    turns = record.get("conversations")
    second = turns[1] if isinstance(turns, list) and len(turns) > 1 else None
    return second.get("value") if isinstance(second, dict) else None


def vlmr1_solution(second) -> str:
    """The ``solution`` VLM-R1's loader makes of a ``conversations`` second turn: its answer tags stripped, then
    re-wrapped as ``"<answer> … </answer>"``."""
    solution = second.replace("<answer>", "").replace("</answer>", "").strip() if isinstance(second, str) else str(second)
    return f"<answer> {solution} </answer>"


def vlmr1_view(row: dict, index: int) -> dict:
    """A VLM-R1 loader row (:func:`vlmr1_row`) in vlmfast's manifest keys. The id is the line's own, else
    ``NNNNN_<image stem>`` (its position: a REC file asks several questions of one image), as ``vlmfast
    convert`` names it."""
    paths = row.get("image_path")
    view = {"images": paths} if paths else {}
    if isinstance(row.get("problem"), str):
        view["prompt"] = row["problem"]
    if "solution" in row:
        view["solution"] = row["solution"]  # the built-in scorers read inside the answer tags
    first = paths[0] if paths and isinstance(paths[0], str) else "none"
    view["id"] = row["id"] if "id" in row else f"{index:05d}_{Path(first).stem}"
    scorer = row.get("scorer") or VLMR1_SCORERS.get(row["accu_reward_method"])
    # a REC box gets no scorer of its own (auto reads a box as one, and --scorer vlm-r1-rec may choose VLM-R1's rules)
    if scorer is not None:
        view["scorer"] = scorer
    for key in ("system", "data_source", "extra_info"):
        if key in row:
            view[key] = row[key]
    return view
