"""Turn command-line inputs (files, directories, globs, prompt files, JSONL manifests, trainers' parquet
and save_to_disk datasets — :mod:`vlmfast.inputs.datasets`) into validated :class:`Request` objects —
before any model is loaded.

Everything that can be wrong with an input is collected as a :class:`Problem` so the user sees
the whole list at once instead of fixing one file per run.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from vlmfast.errors import InputError, UsageError
from vlmfast.evaluation.scoring import SCORERS, truth_text

# Pillow's own decompression-bomb threshold (~89 Mpx); above it an image is refused, not decoded.
DEFAULT_MAX_IMAGE_PIXELS = 89_478_485

IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff"})

# VLM-R1's evaluation instruction (src/eval/test_rec_r1.py), appended to each question.
R1_INSTRUCTION = (
    "First output the thinking process in <think> </think> tags and then output the final answer "
    "in <answer> </answer> tags."
)
TEMPLATES = {"plain": "{prompt}", "r1": "{prompt} " + R1_INSTRUCTION}

# Manifest keys we understand; anything else is ignored (and reported once).
MANIFEST_KEYS = frozenset({"id", "image", "images", "prompt", "system", "messages", "solution", "answer", "scorer",
                           "data_source", "extra_info"})


@dataclass(frozen=True)
class Request:
    """One sample: images (paths as given), the final prompt text and an optional system prompt; the
    ground truth and scorer when the manifest gives them; each image's (width, height) once checked."""

    id: str
    images: tuple[str, ...]
    prompt: str
    system: str | None = None
    truth: object = None
    scorer: str | None = None
    image_sizes: tuple[tuple[int, int], ...] = ()
    data_source: str | None = None  # verl reward functions take it (the dataset's name)
    # The ground truth exactly as the manifest line holds it, and the line itself: trainers hand both to
    # reward functions untouched (dataset columns, verl's extra_info), unlike ``truth`` (normalised for scoring).
    manifest_truth: object = field(default=None, compare=False)
    record: dict | None = field(default=None, compare=False, repr=False)
    # Images embedded in a dataset file: per image, where its bytes lie (vlmfast.inputs.embedded.EmbeddedImage),
    # None for a path; ``images`` then holds labels. Bytes are read and decoded when the batch is prepared.
    image_data: tuple | None = field(default=None, compare=False, repr=False)

    def truth_record(self) -> dict:
        """What a reward function or scorer needs of this request's ground truth."""
        return {"ground_truth": self.truth, "scorer": self.scorer, "data_source": self.data_source,
                "manifest_truth": self.manifest_truth, "record": self.record}


@dataclass(frozen=True)
class Problem:
    """Something wrong with an input: ``where`` (a path or ``file:line``) and ``what``."""

    where: str
    what: str
    def __str__(self) -> str:
        return f"{self.where}: {self.what}"


@dataclass(frozen=True)
class BadInput:
    """A request (or a manifest line that never became one) and everything wrong with it."""

    id: str
    problems: tuple[Problem, ...]
    request: Request | None = None

    @property
    def error(self) -> str:
        return "; ".join(str(p) for p in self.problems)


@dataclass
class Collected:
    """The outcome of input collection: good requests, bad ones (with their problems), sizes."""

    requests: list[Request]
    bad: list[BadInput] = field(default_factory=list)
    image_sizes: dict[str, tuple[int, int]] = field(default_factory=dict)  # path -> (width, height)
    warnings: list[str] = field(default_factory=list)
    order: list[str] = field(default_factory=list)  # every id, good or bad, in input order
    fatal: list[Problem] = field(default_factory=list)  # problems no --skip-bad can turn into rows (duplicate ids)


def apply_template(prompt: str, template: str) -> str:
    if template not in TEMPLATES:
        raise UsageError(f"unknown template {template!r}", hint=f"choose one of: {', '.join(TEMPLATES)}")
    return TEMPLATES[template].format(prompt=prompt)


def expand_images(args: list[str]) -> tuple[list[str], list[Problem]]:
    """Files as given; directories → their image files (sorted, not recursive); globs → sorted matches.

    Paths keep the spelling the user gave so ids stay recognisable.
    """
    paths: list[str] = []
    problems: list[Problem] = []
    for arg in args:
        if glob.has_magic(arg):
            matches = sorted(m for m in glob.glob(arg, recursive=True) if _is_image_name(m) and os.path.isfile(m))
            if not matches:
                problems.append(Problem(arg, "glob matched no image files"))
            paths.extend(matches)
        elif os.path.isdir(arg):
            found = sorted(os.path.join(arg, n) for n in os.listdir(arg) if _is_image_name(n))
            found = [p for p in found if os.path.isfile(p)]
            if not found:
                problems.append(Problem(arg, f"directory holds no image files ({', '.join(sorted(IMAGE_EXTENSIONS))})"))
            paths.extend(found)
        else:
            paths.append(arg)  # existence is checked with every other image in check_images
    return paths, problems


def _is_image_name(name: str) -> bool:
    return Path(name).suffix.lower() in IMAGE_EXTENSIONS


def read_prompt(prompt: str | None, prompt_file: str | None) -> str | None:
    if prompt is not None and prompt_file is not None:
        raise UsageError("--prompt and --prompt-file both given", hint="use one of them")
    if prompt_file is None:
        return prompt
    try:
        text = Path(prompt_file).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read prompt file {prompt_file}: {exc}", hint="give a readable UTF-8 text file") from exc
    if not text:
        raise InputError(f"prompt file {prompt_file} is empty", hint="write the prompt into the file")
    return text


def read_manifest(path: str, default_prompt: str | None, keys=None,
                  max_image_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS) -> tuple[list[Request | BadInput], list[str]]:
    """Parse a manifest into requests and bad lines, in file order. A JSONL file's records are ours —
    ``{"id", "image"|"images", "prompt", "system", "solution"|"answer", "scorer"}`` —, ms-swift's —
    ``{"messages": [...], "images": [...]}`` — or R1-V's — ``{"image_path", "question", "ground_truth"}``.
    A parquet file, a folder of parquet shards or a ``save_to_disk`` folder is read by
    :func:`vlmfast.inputs.datasets.read_dataset` (``keys``: its :class:`~vlmfast.inputs.datasets.DatasetKeys`).
    Relative image paths resolve against the manifest's directory first, then the working directory.
    """
    from vlmfast.inputs.datasets import is_dataset, is_r1v, r1v_view, read_dataset

    if is_dataset(path):
        return read_dataset(path, default_prompt, keys, max_image_pixels)
    if keys is not None and keys.given:
        raise UsageError("--prompt-key, --answer-key and --image-key apply to parquet and Arrow datasets",
                         hint=f"drop them for the JSONL manifest {path}")
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read manifest {path}: {exc}", hint="check the path and permissions") from exc
    base = Path(path).parent
    items: list[Request | BadInput] = []
    unknown: set[str] = set()
    for lineno, line in enumerate(raw.splitlines(), start=1):
        where = f"{path}:{lineno}"
        if not line.strip():
            continue
        try:
            record = json.loads(line.decode("utf-8"))
        except UnicodeDecodeError:
            items.append(_bad_line(where, "line is not valid UTF-8"))
            continue
        except json.JSONDecodeError as exc:
            items.append(_bad_line(where, f"invalid JSON ({exc.msg} at column {exc.colno})"))
            continue
        if not isinstance(record, dict):
            items.append(_bad_line(where, "record is not a JSON object"))
            continue
        line = record
        if is_r1v(record):  # R1-V's evaluation lines: read through our keys, handed to rewards as they are
            record = r1v_view(record)
        else:
            unknown.update(set(record) - MANIFEST_KEYS)
        try:
            request = _record_to_request(record, where, base, default_prompt)
            items.append(request if line is record else dataclasses.replace(request, record=line))
        except ValueError as exc:
            items.append(_bad_line(where, str(exc), rid=str(record.get("id", where))))
    warnings = [f"{path}: ignored unknown manifest fields: {', '.join(sorted(unknown))}"] if unknown else []
    if not items:
        raise InputError(f"manifest {path} holds no records", hint="write one JSON object per line")
    return items, warnings


def _bad_line(where: str, what: str, rid: str | None = None) -> BadInput:
    return BadInput(id=rid or where, problems=(Problem(where, what),))


def _record_to_request(record: dict, where: str, base: Path, default_prompt: str | None) -> Request:
    system = record.get("system")
    prompt = record.get("prompt")
    truth = record.get("solution", record.get("answer"))
    if "messages" in record:  # ms-swift: the last user turn is the prompt; "<image>" marks are dropped
        prompt, system, reply = parse_messages(record["messages"], system)
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
    prompt = prompt if prompt is not None else default_prompt
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValueError('no prompt: give "prompt" in the record, or --prompt / --prompt-file for all')
    scorer = record.get("scorer")
    if scorer is not None and scorer not in SCORERS:
        raise ValueError(f"unknown scorer {scorer!r}: use one of {', '.join(SCORERS)}")
    images = [resolve_relative(i, base) for i in images]
    rid = record.get("id", images[0])
    if not isinstance(rid, (str, int)) or isinstance(rid, bool):
        raise ValueError('"id" must be a string or an integer')
    source = record.get("data_source")
    return Request(id=str(rid), images=tuple(images), prompt=prompt, system=system, truth=truth_text(truth),
                   scorer=scorer, data_source=str(source) if source is not None else None, manifest_truth=truth,
                   record=record)


def parse_messages(messages, system=None):
    """(prompt, system, reference reply) of an ms-swift ``messages`` list: the last user turn is the
    prompt, a system turn the system prompt, the assistant turn after it the reference answer."""
    if not isinstance(messages, list) or not messages:
        raise ValueError('"messages" must be a non-empty list of {"role", "content"} objects')
    users = [i for i, m in enumerate(messages) if isinstance(m, dict) and m.get("role") == "user"]
    if not users or not (question := content_text(messages[users[-1]].get("content"))):
        raise ValueError('"messages" has no user turn with text content')
    for m in messages:
        if isinstance(m, dict) and m.get("role") == "system" and isinstance(m.get("content"), str):
            system = m["content"]
    replies = [m for m in messages[users[-1] + 1:] if isinstance(m, dict) and m.get("role") == "assistant"]
    reply = (content_text(replies[-1].get("content")) or None) if replies else None
    return question.replace("<image>", "").strip(), system, reply


def content_text(content) -> str:
    """The text of a chat turn's content: a string, or OpenAI-style parts (text parts joined)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p if isinstance(p, str) else str(p.get("text", "")) for p in content
                       if isinstance(p, str) or (isinstance(p, dict) and p.get("type", "text") == "text"))
    return ""


def resolve_relative(image: str, base: Path) -> str:
    """A relative image path against ``base`` (the manifest's folder) when it exists there or nowhere else."""
    if os.path.isabs(image) or base == Path("."):
        return image
    candidate = base / image
    return str(candidate) if candidate.exists() or not os.path.exists(image) else image


def check_images(paths: list[str], max_image_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS) -> tuple[dict[str, tuple[int, int]], dict[str, str]]:
    """Open every distinct image header (cheap; no full decode). Returns sizes and problems by path."""
    from PIL import Image

    sizes: dict[str, tuple[int, int]] = {}
    problems: dict[str, str] = {}
    Image.MAX_IMAGE_PIXELS = None  # headers only: the limit is checked below, with the pixel count in the message
    try:
        for path in dict.fromkeys(paths):
            problem = _file_problem(path)
            if problem is None:
                try:
                    with Image.open(path) as im:
                        im.verify()
                        sizes[path] = im.size
                except Exception as exc:  # PIL raises many types for corrupt data
                    problem = f"not a readable image ({type(exc).__name__}: {exc})"
            if problem is None and max_image_pixels is not None and (n := sizes[path][0] * sizes[path][1]) > max_image_pixels:
                problem = (f"image has {n} pixels, over the limit of {max_image_pixels} (--max-image-pixels)"
                           + ("; over twice the limit: a decompression bomb?" if n > 2 * max_image_pixels else ""))
                del sizes[path]
            if problem is not None:
                problems[path] = problem
    finally:
        Image.MAX_IMAGE_PIXELS = max_image_pixels  # process-wide, so decoding later agrees
    return sizes, problems


def _file_problem(path: str) -> str | None:
    if not os.path.exists(path):
        return "file not found"
    if not os.path.isfile(path):
        return "not a file"
    if not os.access(path, os.R_OK):
        return "not readable (permissions)"
    if os.path.getsize(path) == 0:
        return "empty file (0 bytes)"
    return None


def collect(
    images: list[str] | None = None,
    prompt: str | None = None,
    prompt_file: str | None = None,
    manifest: str | None = None,
    template: str = "plain",
    system: str | None = None,
    max_image_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS,
    keys=None,
    format_prompt: str | None = None,
) -> Collected:
    """Build and validate every request. Problems are gathered, not raised: the caller decides
    between failing on all of them at once (the default) and recording error rows (``--skip-bad``).
    ``format_prompt``: a Jinja file each prompt is rendered through (EasyR1's), in place of ``template``."""
    if not images and not manifest:
        raise UsageError("no inputs", hint="give --images PATH... (files, directories or globs) or --manifest FILE "
                                           "(.jsonl, .parquet or a dataset folder)")
    base_prompt = read_prompt(prompt, prompt_file)
    from vlmfast.inputs.datasets import format_prompt as read_format

    render = read_format(format_prompt) if format_prompt is not None else partial(apply_template, template=template)
    entries: list[Request | BadInput] = []  # in input order, good and bad alike
    warnings: list[str] = []
    if images:
        if base_prompt is None:
            raise UsageError("no prompt for --images", hint='give --prompt "..." or --prompt-file FILE')
        for arg in images:
            paths, problems = expand_images([arg])
            entries += [BadInput(id=p.where, problems=(p,)) for p in problems]
            entries += [Request(id=p, images=(p,), prompt=base_prompt, system=system) for p in paths]
    if manifest:
        items, m_warnings = read_manifest(manifest, base_prompt, keys, max_image_pixels)
        entries += [dataclasses.replace(e, system=e.system or system) if isinstance(e, Request) else e for e in items]
        warnings.extend(m_warnings)
    if not entries:
        raise InputError("no images found", hint="check the paths, directories and globs given to --images")

    seen: dict[str, int] = {}
    for e in entries:  # bad rows take an id (and a row) too
        seen[e.id] = seen.get(e.id, 0) + 1
    # ids key the results file and resume: a repeated one cannot become a row of its own
    fatal = [Problem(rid, f"duplicate id ({seen[rid]} records): give each record its own \"id\"")
             for rid in sorted(rid for rid, n in seen.items() if n > 1)]

    requests = [e for e in entries if isinstance(e, Request)]
    # a dataset's rows come with their images checked (embedded ones can only be checked as they are read)
    sizes, image_problems = check_images([p for r in requests if not r.image_sizes for p in r.images], max_image_pixels)
    sizes.update((p, s) for r in requests if r.image_sizes for p, s in zip(r.images, r.image_sizes))
    good: list[Request] = []
    bad: list[BadInput] = [e if e.request is None else dataclasses.replace(
        e, request=dataclasses.replace(e.request, prompt=render(e.request.prompt)))
        for e in entries if isinstance(e, BadInput)]
    for r in requests:
        r = dataclasses.replace(r, prompt=render(r.prompt))
        mine = tuple(Problem(p, image_problems[p]) for p in r.images if p in image_problems)
        if mine:
            bad.append(BadInput(id=r.id, problems=mine, request=r))
        else:
            good.append(dataclasses.replace(r, image_sizes=tuple(sizes[p] for p in r.images)))
    return Collected(requests=good, bad=bad, image_sizes=sizes, warnings=warnings, order=[e.id for e in entries], fatal=fatal)


def raise_for_problems(collected: Collected, *, skip_bad: bool = False) -> None:
    """Any bad input fails the whole run before anything is loaded or written, every problem listed in
    one error; with ``skip_bad`` only fatal problems (duplicate ids) do, with the others listed too."""
    if not collected.fatal and (skip_bad or not collected.bad):
        return
    problems = list(dict.fromkeys([*collected.fatal, *(p for b in collected.bad for p in b.problems)]))  # once each
    listing = "\n".join(f"  - {p}" for p in problems[:50])
    more = f"\n  … and {len(problems) - 50} more" if len(problems) > 50 else ""
    hint = "fix or remove them, or pass --skip-bad to record an error row for each and run the rest"
    if collected.fatal:
        hint = "ids must be unique (they key the results file and resume); " + ("fix the rest too, or keep --skip-bad "
                                                                               "for them" if skip_bad else hint)
    raise InputError(f"{len(problems)} bad input(s); nothing was run:\n{listing}{more}", hint=hint, problems=problems)
