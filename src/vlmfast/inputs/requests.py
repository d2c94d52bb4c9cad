"""Turn command-line inputs (files, directories, globs, prompt files, JSONL manifests, trainers' parquet
and save_to_disk datasets — :mod:`vlmfast.inputs.datasets`) into validated :class:`Request` objects —
before any model is loaded. Everything that can be wrong with an input is collected as a :class:`Problem`
so the user sees the whole list at once instead of fixing one file per run.
"""

from __future__ import annotations

import dataclasses
import glob
import os
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from vlmfast.errors import InputError, UsageError
# the records every input reader makes (JSONL, folders, datasets), kept importable from here, where callers found them
from vlmfast.inputs.records import DEFAULT_MAX_IMAGE_PIXELS, BadInput, Problem, Request, check_images  # noqa: F401

IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".jfif", ".jpe", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff"})

# VLM-R1's evaluation instruction (src/eval/test_rec_r1.py), appended to each question.
R1_INSTRUCTION = (
    "First output the thinking process in <think> </think> tags and then output the final answer "
    "in <answer> </answer> tags."
)
# VLM-R1's referring-expression (REC) question template, as its trainer and src/eval/test_rec_r1.py build it
REC_INSTRUCTION = R1_INSTRUCTION + " Output the final answer in JSON format."
TEMPLATES = {"plain": "{prompt}", "r1": "{prompt} " + R1_INSTRUCTION, "rec": "{prompt} " + REC_INSTRUCTION}


@dataclass
class Collected:
    """The outcome of input collection: good requests, bad ones (with their problems), sizes."""

    requests: list[Request]
    bad: list[BadInput] = field(default_factory=list)
    image_sizes: dict[str, tuple[int, int]] = field(default_factory=dict)  # path -> (width, height)
    warnings: list[str] = field(default_factory=list)
    order: list[str] = field(default_factory=list)  # every id, good or bad, in input order
    fatal: list[Problem] = field(default_factory=list)  # problems no --skip-bad can turn into rows (duplicate ids)
    manifest: str | None = None  # the --manifest the requests came from, if any
    image_root: str | None = None  # the --image-root its relative image paths were read under, if given


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
            # hidden files left out, as a glob leaves them: macOS's "._x.png" beside every copied x.png is no image
            found = sorted(os.path.join(arg, n) for n in os.listdir(arg) if _is_image_name(n) and not n.startswith("."))
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
        if prompt is not None and not prompt.strip():  # e.g. --prompt "$Q" with Q unset
            raise UsageError("--prompt is empty", hint='give the question, e.g. --prompt "How many cars are there?"')
        try:  # bytes that are not UTF-8 reach Python as surrogates; the tokenizer would raise after the model loads
            prompt is None or prompt.encode("utf-8")
        except UnicodeEncodeError:
            raise UsageError("--prompt is not valid UTF-8 text", hint="write it in UTF-8 (or put it in a UTF-8 file: "
                                                                       "--prompt-file)") from None
        return prompt
    try:
        text = Path(prompt_file).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read prompt file {prompt_file}: {exc}", hint="give a readable UTF-8 text file") from exc
    if not text:
        raise InputError(f"prompt file {prompt_file} is empty", hint="write the prompt into the file")
    return text


_LAST_READ: dict = {}  # the last manifest read, by its files' state and the reading's settings → (items, warnings)


def read_manifest(path: str, default_prompt: str | None, keys=None, max_image_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS,
                  *, images: bool = True, image_root: str | None = None) -> tuple[list[Request | BadInput], list[str]]:
    """:func:`_read_manifest`, read again only when the manifest's files changed (a sweep reads its inputs
    for every checkpoint: a VLMEvalKit TSV's images were decoded anew each time, seconds per checkpoint)."""
    from vlmfast.files import given_path

    given_path("--manifest", path)  # "" (an unset shell variable) would read the current directory as a dataset
    key = (_files_state(path), default_prompt, keys, max_image_pixels, images, image_root)
    if key[0] is None:  # its files cannot be told: read each time
        return _read_manifest(path, default_prompt, keys, max_image_pixels, images=images, image_root=image_root)
    if key not in _LAST_READ:
        _LAST_READ.clear()
        _LAST_READ[key] = _read_manifest(path, default_prompt, keys, max_image_pixels, images=images, image_root=image_root)
    items, warnings = _LAST_READ[key]
    return list(items), list(warnings)


def _files_state(path: str, whole_below: int = 8 << 20) -> tuple | None:
    """(path, size, modification time) of the manifest's files (a dataset folder's, sorted), and their bytes'
    digest when they are small (an edit within one tick of the file system's clock keeps the time); None when
    unreadable."""
    import hashlib

    try:
        p = Path(path).absolute()
        files = [p] if p.is_file() else sorted(q for q in p.rglob("*") if q.is_file())
        state = [(str(q), st.st_size, st.st_mtime_ns) for q in files for st in [q.stat()]]
        if sum(size for _, size, _ in state) < whole_below:
            state.append(tuple(hashlib.sha1(q.read_bytes()).hexdigest() for q in files))
        return tuple(state) or None
    except OSError:
        return None


def _read_manifest(path: str, default_prompt: str | None, keys=None, max_image_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS,
                   *, images: bool = True, image_root: str | None = None) -> tuple[list[Request | BadInput], list[str]]:
    """Parse a manifest into requests and bad lines, in file order. A JSONL file's records are ours —
    ``{"id", "image"|"images", "prompt", "system", "solution"|"answer", "scorer"}`` —, ms-swift's —
    ``{"messages": [...], "images": [...]}`` — or R1-V's — ``{"image_path", "question", "ground_truth"}``.
    A parquet file, a folder of parquet shards or a ``save_to_disk`` folder is read by
    :func:`vlmfast.inputs.datasets.read_dataset` (``keys``: its :class:`~vlmfast.inputs.datasets.DatasetKeys`).
    Relative image paths resolve against ``image_root`` (default: the manifest's directory) first, then the
    working directory.
    ``images=False``: a dataset's or TSV's images are neither decoded nor checked (a JSONL's never are
    here: :func:`collect` checks them), for reading ids and ground truths only.
    """
    from vlmfast.inputs.datasets import is_dataset, read_dataset
    from vlmfast.inputs.jsonl import read_jsonl
    from vlmfast.inputs.tsv import is_tsv, read_tsv

    if is_dataset(path):
        return read_dataset(path, default_prompt, keys, max_image_pixels, images=images, image_root=image_root)
    if is_tsv(path) and not (keys is not None and keys.given):
        return read_tsv(path, default_prompt, max_image_pixels, images=images)
    if keys is not None and keys.given:
        raise UsageError("--prompt-key, --answer-key and --image-key apply to parquet and Arrow datasets",
                         hint=f"drop them for the JSONL manifest {path}")
    return read_jsonl(path, default_prompt, image_root)


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
    image_root: str | None = None,
    say=None,
) -> Collected:
    """Build and validate every request. Problems are gathered, not raised: the caller decides
    between failing on all of them at once (the default) and recording error rows (``--skip-bad``).
    ``format_prompt``: a Jinja file each prompt is rendered through (EasyR1's), in place of ``template``.
    ``image_root``: the folder the manifest's relative image paths are under (see :func:`read_manifest`).
    ``say``: called with a line before a check of many images (:func:`~vlmfast.inputs.records.check_images`)."""
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
        given: set[str] = set()
        twice = 0
        for arg in images:
            paths, problems = expand_images([arg])
            entries += [BadInput(id=p.where, problems=(p,)) for p in problems]
            # an image named twice (by a directory and a glob of it, "./imgs" and "imgs/*.png") is one request
            # with one prompt: run once, under the first spelling
            for p in paths:
                key = os.path.abspath(p)  # normalized: "./a.png", "a.png" and "imgs/../a.png" are one file
                twice += key in given
                entries += [] if key in given else [Request(id=p, images=(p,), prompt=base_prompt, system=system)]
                given.add(key)
        if twice:
            warnings.append(f"--images named {twice} image(s) more than once (e.g. by a folder and a glob of it): "
                            "each runs once")
    if manifest:
        items, m_warnings = read_manifest(manifest, base_prompt, keys, max_image_pixels, image_root=image_root)
        if base_prompt is not None and not images and not any(getattr(e, "prompt", None) == base_prompt for e in items):
            m_warnings.append(f"--prompt is for records without a prompt of their own; every record of {manifest} has "
                              "one, so it is not used")
        entries += items  # --system for the records without one of their own: given below, with the prompt rendered
        warnings.extend(m_warnings)
    if not entries:
        raise InputError("no images found", hint="check the paths, directories and globs given to --images")

    seen: dict[str, list[str]] = {}
    for e in entries:  # bad rows take an id (and a row) too; where each record is, to name them
        seen.setdefault(e.id, []).append((e.source or "--images") if isinstance(e, Request) else e.problems[0].where)
    # ids key the results file and resume: a repeated one cannot become a row of its own
    fatal = [Problem(rid, f"duplicate id ({len(seen[rid])} records: {', '.join(str(w) for w in seen[rid][:5] if w)}"
                          f"{' …' if len(seen[rid]) > 5 else ''}): give each record its own id (\"id\"; a TSV's \"index\")")
             for rid in sorted(rid for rid, where in seen.items() if len(where) > 1)]

    requests = [e for e in entries if isinstance(e, Request)]
    # a dataset's rows come with their images checked (embedded ones can only be checked as they are read)
    sizes, image_problems = check_images([p for r in requests if not r.image_sizes for p in r.images], max_image_pixels,
                                         say=say)
    sizes.update((p, s) for r in requests if r.image_sizes for p, s in zip(r.images, r.image_sizes))
    good: list[Request] = []
    bad: list[BadInput] = [e if e.request is None else dataclasses.replace(
        e, request=dataclasses.replace(e.request, prompt=render(e.request.prompt)))
        for e in entries if isinstance(e, BadInput)]
    for r in requests:  # one copy of each request (a resume of 50,000 rows made three: 0.2 ms a row)
        # a manifest's image is named with the line that asks for it (the request's id, where it has one)
        said = f" ({r.source}{'' if r.id == r.source else f', id {r.id}'})" if r.source else ""
        mine = tuple(Problem(p if len(p) <= 200 else p[:60] + f"… ({len(p)} characters)", image_problems[p] + said)
                     for p in r.images if p in image_problems)  # a data URI's base64 is not echoed whole
        if mine:
            bad.append(BadInput(id=r.id, problems=mine, request=dataclasses.replace(
                r, prompt=render(r.prompt), system=r.system or system)))
        else:
            good.append(dataclasses.replace(r, prompt=render(r.prompt), system=r.system or system,
                                            image_sizes=tuple(sizes[p] for p in r.images)))
    return Collected(requests=good, bad=bad, image_sizes=sizes, warnings=warnings, order=[e.id for e in entries], fatal=fatal,
                     manifest=manifest, image_root=image_root)


def raise_for_problems(collected: Collected, *, skip_bad: bool = False, offers_skip_bad: bool = True) -> None:
    """Any bad input fails the whole run before anything is loaded or written, every problem listed in
    one error; with ``skip_bad`` only fatal problems (duplicate ids) do, with the others listed too — and bad
    inputs with none to run beside them (no model is loaded to write error rows alone). ``offers_skip_bad``:
    whether the command has ``--skip-bad`` to suggest (``bench`` measures whole workloads: it has none)."""
    if not collected.fatal and (not collected.bad or (skip_bad and collected.requests)):
        return
    problems = list(dict.fromkeys([*collected.fatal, *(p for b in collected.bad for p in b.problems)]))  # once each
    listing = "\n".join(f"  - {p}" for p in problems[:50])
    more = f"\n  … and {len(problems) - 50} more" if len(problems) > 50 else ""
    # --skip-bad is offered only where it helps: other inputs to run, and problems it turns into rows
    hint = ("fix or remove them" + ", or pass --skip-bad to record an error row for each and run the rest" * offers_skip_bad
            if collected.requests else "fix them: there is no other input to run"
            + " (--skip-bad keeps error rows beside inputs that run; no model was loaded)" * skip_bad)
    if collected.manifest and sum("file not found" in str(p) for p in problems) * 2 > len(problems):  # elsewhere
        hint += (f"; relative image paths were read under --image-root {collected.image_root} (then the working "
                 "folder): give the folder they are relative to" if collected.image_root else
                 "; a manifest's relative image paths are read against its own folder: for images in another folder "
                 "(VLM-R1's --image_folders), give --image-root DIR")
    if collected.fatal:
        unique = "ids must be unique (they key the results file and resume)"
        hint = (f"{unique}: give each record its own \"id\"" if not collected.bad
                else f"{unique}; fix the rest too, or keep --skip-bad for them" if skip_bad else f"{unique}; {hint}")
    raise InputError(f"{len(problems)} bad input(s); nothing was run:\n{listing}{more}", hint=hint, problems=problems)
