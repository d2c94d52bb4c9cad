"""One request and what can be wrong with it: the records every input reader makes (command-line
files and JSONL manifests in :mod:`vlmfast.inputs.requests`, trainers' datasets in
:mod:`vlmfast.inputs.datasets`), and the checks they share (image headers, chat messages, relative paths)."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path

# Pillow's own decompression-bomb threshold (~89 Mpx); above it an image is refused, not decoded.
DEFAULT_MAX_IMAGE_PIXELS = 89_478_485

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
    # The truth as the file itself writes it, where ``manifest_truth`` is what a trainer's loader made of it (a
    # VLM-R1 ``conversations`` line: its second turn, which the loader re-wraps in answer tags): the published
    # evaluation scripts' scorers read the file's value. None: ``manifest_truth``.
    written_truth: object = field(default=None, compare=False, repr=False)
    # Images embedded in a dataset file: per image, where its bytes lie (vlmfast.inputs.embedded.EmbeddedImage),
    # None for a path; ``images`` then holds labels. Bytes are read and decoded when the batch is prepared.
    image_data: tuple | None = field(default=None, compare=False, repr=False)
    # A resumed request's answers (sample indices) the results file already holds: not decoded again
    # where answers are decoded one by one (continuous batching); draws are keyed by sample, so the rest
    # are the answers an uninterrupted run gives.
    answered: frozenset = field(default=frozenset(), compare=False, repr=False)
    source: str | None = field(default=None, compare=False, repr=False)  # a manifest's file:line, named in its problems
    # A JSONL manifest's record: its place among the file's JSON values (0-based), by which a VLM-R1 line without an
    # id is named, and vlmfast convert named an ms-swift record without one in 0.18.9 and earlier (vlmfast.run.results)
    position: int | None = field(default=None, compare=False, repr=False)

    def truth_record(self) -> dict:
        """What a reward function or scorer needs of this request's ground truth."""
        return {"ground_truth": self.truth, "scorer": self.scorer, "data_source": self.data_source,
                "manifest_truth": self.manifest_truth, "record": self.record,
                "reference_truth": self.manifest_truth if self.written_truth is None else self.written_truth}


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


def check_image_marks(texts, n_images: int, *, fewer_ok: bool = False) -> None:
    """A ValueError when the texts hold ``<image>`` marks but not one per image: the trainers' processors refuse
    such a row (one image slot per mark), and dropping the marks would silently ask another question.
    ``fewer_ok`` (ms-swift's records): fewer marks than images pass, as ms-swift's ``_add_default_tags`` puts the
    missing marks before the first message (its images first, as vlmfast puts every image)."""
    marks = sum(t.count("<image>") for t in texts if isinstance(t, str))
    if marks and (marks > n_images if fewer_ok else marks != n_images):
        raise ValueError(f"{marks} <image> mark(s) in the text but {n_images} image(s): give one mark per image "
                         "(or none: the images then go before the text)")


def first_image(record: dict) -> str | None:
    """The first image a manifest record names, as it writes it (a line without an id is named by it), or None."""
    images = record.get("images", record.get("image"))
    first = images[0] if isinstance(images, list) and images else images
    first = first.get("path") if isinstance(first, dict) else first
    return first if isinstance(first, str) and first else None


def image_id(record: dict, by_image: dict[str, int]) -> str | None:
    """The id of a manifest record without one: its first image as written, and for a later record without an id
    asking about the same image (an R1-V or ms-swift file asking several questions of one image) the image and its
    rank, ``IMAGE#2``, ``IMAGE#3``, …; the record counted in ``by_image`` (image → records so far). None where no
    image path names it (none, or base64 data). ``--manifest`` and ``vlmfast convert`` both name records so: a
    file run as it is and its converted manifest give the same ids."""
    first = first_image(record)
    if first is None or is_base64_image(first):
        return None
    by_image[first] = rank = by_image.get(first, 0) + 1
    return first if rank == 1 else f"{first}#{rank}"


# The first bytes of the image formats a base64 string written where a path goes (ms-swift reads such strings) holds.
_IMAGE_MAGIC = (b"\x89PNG", b"\xff\xd8\xff", b"GIF8", b"RIFF", b"BM", b"II*\x00", b"MM\x00*")


def is_base64_image(text: str) -> bool:
    """Whether ``text`` is base64 image data rather than a path: a long run of the base64 alphabet whose
    decoded start is an image format's signature."""
    import base64
    import binascii
    import re

    if len(text) < 100 or not re.fullmatch(r"[A-Za-z0-9+/\s]+=*", text[:4096]):
        return False
    try:
        return base64.b64decode(text[:16]).startswith(_IMAGE_MAGIC)
    except (binascii.Error, ValueError):
        return False


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
    if os.path.isabs(image) or base == Path(".") or image.startswith(str(base) + os.sep) or image.startswith("data:"):
        return image  # resolved already (a VLM-R1 line's images are, before the request is built), or no path
    candidate = base / image
    return str(candidate) if candidate.exists() or not os.path.exists(image) else image


# Images to decode above which check_images says so first: each takes about 5 ms (4,000 took 19.6 s of silence).
SAY_CHECKING_ABOVE = 500


def check_images(paths: list[str], max_image_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS,
                 say=None) -> tuple[dict[str, tuple[int, int]], dict[str, str]]:
    """Decode every distinct image (:func:`_check_bytes`; a thread per core: Pillow decodes outside the GIL),
    each file once per process while it is unchanged (a sweep checks its inputs for every checkpoint).
    Returns sizes and problems by path. ``say``: called with one line ("checking N images …") before more
    than ``SAY_CHECKING_ABOVE`` images not yet checked are decoded; nothing is printed here."""
    from concurrent.futures import ThreadPoolExecutor

    distinct = list(dict.fromkeys(paths))
    if say is not None and len(distinct) > SAY_CHECKING_ABOVE:
        fresh = sum(_checked_key(path, max_image_pixels) not in _CHECKED for path in distinct)
        if fresh > SAY_CHECKING_ABOVE:
            say(f"checking {fresh:,} images (each decoded whole, once: a cut or corrupt file is found now, not mid-run) …")
    with _own_pixel_limit(max_image_pixels), ThreadPoolExecutor(max_workers=max(1, min(8, os.cpu_count() or 1))) as pool:
        checked = list(pool.map(lambda path: _checked_file(path, max_image_pixels), distinct))
    sizes = {path: size for path, (size, problem) in zip(distinct, checked) if problem is None}
    return sizes, {path: problem for path, (size, problem) in zip(distinct, checked) if problem is not None}


_CHECKED: dict[tuple, tuple] = {}  # (path, size in bytes, mtime, limit) → (size, problem)


def _checked_file(path: str, max_image_pixels: int | None) -> tuple[tuple[int, int] | None, str | None]:
    if (problem := _file_problem(path)) is not None:
        return None, problem
    try:
        key = _checked_key(path, max_image_pixels, strict=True)
        if key not in _CHECKED:
            with open(path, "rb") as f:
                _CHECKED[key] = _check_bytes(f.read(), max_image_pixels)
    except OSError as exc:  # gone or unreadable since the first look
        return None, f"cannot be read ({exc.strerror or exc})"
    return _CHECKED[key]


def _checked_key(path: str, max_image_pixels: int | None, strict: bool = False) -> tuple | None:
    """The file's key in ``_CHECKED``: its absolute path, size, modification time and the limit; None for a file
    that cannot be looked at (``strict``: the OSError raised)."""
    try:
        stat = os.stat(path)
    except (OSError, ValueError):
        if strict:
            raise
        return None
    return os.path.abspath(path), stat.st_size, stat.st_mtime_ns, max_image_pixels


@contextlib.contextmanager
def _own_pixel_limit(max_image_pixels: int | None):
    """Pillow's process-wide pixel limit off while images are checked (the limit is checked by the caller, with
    the pixel count in the message), then set to ``max_image_pixels``, so decoding later agrees."""
    from PIL import Image

    Image.MAX_IMAGE_PIXELS = None
    try:
        yield
    finally:
        Image.MAX_IMAGE_PIXELS = max_image_pixels


def _file_problem(path: str) -> str | None:
    if path.startswith("data:"):
        return "a data URI: images are read from local files (write it to a file first, or embed it in a parquet dataset)"
    if not os.path.exists(path):
        return "a URL: images are read from local files (download it first)" if "://" in path else "file not found"
    if not os.path.isfile(path):
        return "not a file"
    if not os.access(path, os.R_OK):
        return "not readable (permissions)"
    if os.path.getsize(path) == 0:
        return "empty file (0 bytes)"
    return None


# The longest side over the shortest that Qwen's processors resize (``smart_resize`` in transformers and
# qwen-vl-utils raises above it).
MAX_ASPECT_RATIO = 200


def check_image_bytes(data: bytes, max_image_pixels: int | None) -> tuple[tuple[int, int] | None, str | None]:
    """(size, problem) of one image's bytes (embedded in a dataset), checked as :func:`check_images` checks a file."""
    with _own_pixel_limit(max_image_pixels):
        return _check_bytes(data, max_image_pixels)


def _check_bytes(data: bytes, max_image_pixels: int | None) -> tuple[tuple[int, int] | None, str | None]:
    """(size, problem) of one image's bytes: its pixel count against ``max_image_pixels`` (read from the header,
    before any decoding), its aspect ratio against what the processor resizes, and the whole image decoded —
    a header alone passes a truncated JPEG (a download cut short), whose decoding then fails mid-run."""
    import io

    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as im:
            size = im.size
            n = size[0] * size[1]
            if max_image_pixels is not None and n > max_image_pixels:
                return None, (f"image has {n} pixels, over the limit of {max_image_pixels} (--max-image-pixels)"
                              + ("; over twice the limit: a decompression bomb?" if n > 2 * max_image_pixels else ""))
            if max(size) > MAX_ASPECT_RATIO * min(size):
                return None, (f"{size[0]}×{size[1]} px: an aspect ratio over {MAX_ASPECT_RATIO}:1, which Qwen's image "
                              "processor refuses (crop or pad it)")
            im.load()  # the header's limit is checked above; decoding reads every byte
    except Image.UnidentifiedImageError:  # its message names an in-memory object at an address: nothing a user can act on
        return None, ("not a readable image (UnidentifiedImageError: no image format Pillow reads starts this file: "
                      "is it an image, or named with an image extension by mistake?)")
    except Exception as exc:  # PIL raises many types for corrupt data
        return None, f"not a readable image ({type(exc).__name__}: {exc})"
    return size, None
