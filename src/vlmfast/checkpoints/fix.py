"""Fix a checkpoint on disk: the cache switched back on, ``<|im_end|>`` back in the EOS list, generation values
plain generate trips on repaired, missing processor/tokenizer/chat-template files copied from the base; and
merge a LoRA adapter into a full model.

:func:`plan_fix` only reads and returns a :class:`FixPlan` (file edits with old/new text, files to
copy); :func:`apply_fix` writes it: each file atomically (temp file in the same dir, then
``os.replace``), after keeping the original as ``NAME.orig`` (never overwritten, so repeated fixes keep
the first original). A fixed checkpoint plans nothing: fixing twice changes nothing.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from vlmfast.checkpoints.readers import (
    PROCESSOR_GROUP, TEMPLATE_FILES, TOKENIZER_FILES, cache_off_locations, chat_stop, family_eos, has_chat_template,
    has_processor_config, is_adapter_dir, read_configs, read_json_object, saved_eos,
)
from vlmfast.errors import CheckpointError
from vlmfast.files import atomic_write, publish_directory
from vlmfast.checkpoints.config_family import refuse_other_family
from vlmfast.checkpoints.generation_values import repair_generation_values
from vlmfast.checkpoints.locate import Located, locate, located, require


class FixError(CheckpointError):
    """A fix that cannot be applied: a hub id, an adapter, a read-only or changed checkpoint."""


@dataclass(frozen=True)
class FileEdit:
    """Rewrite (or create, when ``old`` is None) one text file."""

    path: Path
    old: str | None
    new: str
    changes: tuple[str, ...]  # what changes, one "file: key old -> new" line each


@dataclass(frozen=True)
class FileCopy:
    src: Path
    dst: Path


@dataclass
class FixPlan:
    """What :func:`apply_fix` would do to ``target``; empty when there is nothing to fix."""

    target: Path
    edits: list[FileEdit] = field(default_factory=list)
    copies: list[FileCopy] = field(default_factory=list)
    others: list[Path] = field(default_factory=list)  # sibling checkpoints, also cache-off, that this plan leaves alone

    @property
    def empty(self) -> bool:
        return not self.edits and not self.copies

    def changes(self) -> list[str]:
        """One line per change, for a human."""
        return [c for e in self.edits for c in e.changes] + [f"copy {c.src} -> {c.dst.name}" for c in self.copies]

    def diff(self) -> str:
        """Which checkpoint changes, the unified diff of every edit, then one line per copied file."""
        if self.empty:
            return ""
        parts = [f"# checkpoint: {self.target}\n"]
        if self.others:
            parts.append(f"# not changed, also cache-off: {', '.join(map(step_name, self.others))} "
                         f"(run vlmfast fix on each)\n")
        for e in self.edits:
            name = e.path.name
            parts += difflib.unified_diff((e.old or "").splitlines(keepends=True), e.new.splitlines(keepends=True),
                                          "/dev/null" if e.old is None else f"a/{name}", f"b/{name}")
        parts += [f"# copy {c.src} -> {c.dst}\n" for c in self.copies]
        return "".join(parts)


@dataclass
class FixResult:
    plan: FixPlan
    dry_run: bool
    diff: str
    written: list[Path] = field(default_factory=list)
    backups: list[Path] = field(default_factory=list)
    copied: list[Path] = field(default_factory=list)


def _local_dir(spec, option: str | None = None) -> Path:
    """The directory to fix: a local model (or its config-only save), never a hub id or an adapter."""
    return require(located(spec, option=option), "model", "fsdp", "incomplete").path


def step_name(d: Path) -> str:
    """A checkpoint dir's name in a run: ``checkpoint-N``, or EasyR1's and verl's ``global_step_N`` for its
    ``actor/huggingface``."""
    return d.parents[1].name if d.name == "huggingface" and d.parent.name == "actor" else d.name


def _cache_off_siblings(spec, d: Path) -> list[Path]:
    """When ``spec`` is a run dir that resolved to one of its checkpoints: the other checkpoint dirs beside
    ``d`` whose configs also turn the cache off (fix changes only ``d``). A checkpoint handed over already
    located names its own directory."""
    if isinstance(spec, Located) or Path(spec).expanduser().resolve() == d.resolve():
        return []
    if step_name(d) != d.name:  # EasyR1, verl: the other steps' global_step_N/actor/huggingface
        candidates = [p / "actor" / "huggingface" for p in d.parents[2].iterdir() if p.is_dir()]
    else:
        candidates = [p for p in d.parent.iterdir() if p.is_dir()]
    others = []
    # in step order (checkpoint-9 before checkpoint-10), as the run wrote them
    steps = [c for c in candidates if c != d and (c / "config.json").is_file()]
    for sibling in sorted(steps, key=lambda c: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(c))]):
        try:
            config, generation = read_configs(sibling)
        except Exception:  # noqa: BLE001 - an unreadable sibling is not this fix's business
            continue
        if cache_off_locations(config, generation):
            others.append(sibling)
    return others


def plan_fix(ckpt, processor_from=None) -> FixPlan:
    """Plan the fixes for a local checkpoint (trainer output dirs resolve as in doctor). Reads only.

    config.json: ``use_cache`` false → true (top level, ``text_config``); generation_config.json:
    ``use_cache`` false → true, do_sample at temperature 0 → greedy, a short ``max_length`` dropped
    (:mod:`vlmfast.checkpoints.generation_values`), and an EOS list that lacks the family's chat stop
    (``<|im_end|>``) becomes the family's base list (the base's own when ``processor_from`` is given).
    ``processor_from`` (the base model dir) also supplies processor, tokenizer and chat-template files the
    checkpoint lacks.
    """
    d = _local_dir(ckpt)
    base = _local_dir(processor_from, "--processor-from") if processor_from is not None else None
    plan = FixPlan(d, others=_cache_off_siblings(ckpt, d))
    if base is not None:
        refuse_other_family(_read(d / "config.json"), d, base)  # its processor, tokenizer, EOS: another vocabulary's
        plan.copies, created = _missing_files(d, base)
        plan.edits += created
    config = _read(d / "config.json")
    config_text = (d / "config.json").read_text(encoding="utf-8")
    edit = _cache_edit(d / "config.json", config_text, config)
    if edit:
        plan.edits.append(edit)
    plan.edits += _generation_edits(d, config, base, plan.copies)
    plan.edits = _with_v4_form(d, plan.edits)
    return plan


def _with_v4_form(d: Path, edits: list[FileEdit]) -> list[FileEdit]:
    """Where transformers 4.x is installed: ``edits`` plus what a checkpoint saved by transformers 5 needs
    for 4.x to read it (:mod:`vlmfast.checkpoints.portable`): tokenizer_config.json's special-token list
    under the name both lines read; config.json's rotary settings also as 4.x names them (one edit with the
    cache's, if any). 5.x reads either form: there a fix leaves them as they are."""
    from vlmfast.checkpoints.portable import transformers_major

    return _v4_form(d, edits) if transformers_major() < 5 else edits


def _v4_form(d: Path, edits: list[FileEdit]) -> list[FileEdit]:
    from vlmfast.checkpoints.portable import config_form, tokenizer_form

    out = list(edits)
    path = d / "tokenizer_config.json"
    if path.is_file():
        text = path.read_text(encoding="utf-8")
        tokenizer, changes = tokenizer_form(_read(path))
        if changes:
            out.append(FileEdit(path, text, dump_like(text, tokenizer), tuple(changes)))
    path = d / "config.json"
    earlier = next((e for e in edits if e.path == path), None)
    text = path.read_text(encoding="utf-8")
    config, changes = config_form(json.loads(earlier.new) if earlier else _read(path))
    if changes:
        out = [e for e in out if e is not earlier]
        out.append(FileEdit(path, text, dump_like(text, config), (*(earlier.changes if earlier else ()), *changes)))
    return out


def _read(path: Path) -> dict:
    """A config file as a dict; anything unreadable is a FixError naming the file, never a traceback."""
    try:
        return read_json_object(path)
    except CheckpointError as exc:
        orig = path.with_name(path.name + ".orig")
        raise FixError(exc.message, hint=f"restore it from {orig.name} (an earlier fix's backup)" if orig.is_file()
                       else "copy it from the base model, or from another checkpoint of the run") from None


def _missing_files(d: Path, base: Path) -> tuple[list[FileCopy], list[FileEdit]]:
    copies = []
    if not has_processor_config(d):
        copies += [FileCopy(base / f, d / f) for f in PROCESSOR_GROUP if (base / f).is_file() and not (d / f).exists()]
    copies += [FileCopy(base / f, d / f) for f in TOKENIZER_FILES if (base / f).is_file() and not (d / f).exists()]
    edits = []
    if not has_chat_template(d):
        files = [FileCopy(base / f, d / f) for f in TEMPLATE_FILES if (base / f).is_file()]
        template = _read(base / "tokenizer_config.json").get("chat_template") \
            if not files and (base / "tokenizer_config.json").is_file() else None
        copies += files
        if isinstance(template, str):  # old bases keep it in tokenizer_config.json: give it its own file
            edits.append(FileEdit(d / "chat_template.jinja", None, template, ("chat_template.jinja: from the base's tokenizer_config.json",)))
    return copies, edits


def _cache_edit(path: Path, text: str, config: dict) -> FileEdit | None:
    changes = []
    if config.get("use_cache") is False:
        config["use_cache"] = True
        changes.append(f"{path.name}: use_cache false -> true")
    sub = config.get("text_config")
    if isinstance(sub, dict) and sub.get("use_cache") is False:
        sub["use_cache"] = True
        changes.append(f"{path.name}: text_config.use_cache false -> true")
    return FileEdit(path, text, dump_like(text, config), tuple(changes)) if changes else None


def _generation_edits(d: Path, config: dict, base: Path | None, copies: list[FileCopy]) -> list[FileEdit]:
    path = d / "generation_config.json"
    text = path.read_text(encoding="utf-8") if path.is_file() else None
    gen = _read(path) if text is not None else None
    _, im_end = chat_stop(d, config, base)  # tokenizer files missing here: the base's say it
    base_eos = None
    if base is not None:
        base_gen = base / "generation_config.json"
        base_eos = saved_eos(_read(base / "config.json"), _read(base_gen) if base_gen.is_file() else None)[0] or None
    eos, _ = saved_eos(config, gen)
    if base_eos:
        target = base_eos + ([im_end] if im_end is not None and im_end not in base_eos else [])
    else:
        target = family_eos(d, config, eos, im_end) if im_end is not None else eos  # the family's, completed
    wanted = target if set(target) != set(eos) else None  # order does not matter to stopping: no churn
    if gen is None:
        # lost in a merge: the base's file (its EOS list and sampling settings) where it says what is wanted
        if base is not None and (base / "generation_config.json").is_file() and set(wanted or eos) == set(base_eos or eos):
            copies.append(FileCopy(base / "generation_config.json", path))
            return []
        if wanted is None:
            return []
        gen = {k: config[k] for k in ("bos_token_id", "pad_token_id") if config.get(k) is not None}
    changes = []
    if gen.get("use_cache") is False:
        gen["use_cache"] = True
        changes.append("generation_config.json: use_cache false -> true")
    changes += repair_generation_values(config, gen)  # do_sample at temperature 0, a short max_length
    if wanted is not None:
        changes.append(f"generation_config.json: eos_token_id {gen.get('eos_token_id')} -> {wanted}")
        gen["eos_token_id"] = wanted
    if not changes:
        return []
    return [FileEdit(path, text, dump_like(text, gen), tuple(changes))]


def dump_like(original: str | None, data: dict) -> str:
    """JSON text for ``data`` in the original's style: its indent, key order, escaping and final newline."""
    indent = 2
    if original:
        for line in original.splitlines()[1:]:
            stripped = line.lstrip(" ")
            if stripped and len(line) > len(stripped):
                indent = len(line) - len(stripped)
                break
    text = json.dumps(data, indent=indent, ensure_ascii=original is not None and "\\u" in original)
    return text + ("\n" if original is None or original.endswith("\n") else "")


def apply_fix(plan: FixPlan, dry_run: bool = False, *, backup: bool = True) -> FixResult:
    """Write ``plan`` (nothing when ``dry_run``: the result's ``diff`` says what would change). Keeps
    ``NAME.orig`` of each edited file unless one exists or ``backup`` is false. FixError when the
    directory is read-only or a file changed since the plan was made."""
    result = FixResult(plan, dry_run, plan.diff())
    if dry_run or plan.empty:
        return result
    _check_writable(plan)
    try:
        for c in plan.copies:
            atomic_write(c.dst, c.src.read_bytes(), mode=0o644)
            result.copied.append(c.dst)
        for e in plan.edits:
            if e.old is not None and backup:
                orig = e.path.with_name(e.path.name + ".orig")
                if not orig.exists():  # the first original survives repeated fixes
                    atomic_write(orig, e.path.read_bytes(), mode=e.path.stat().st_mode & 0o777)
                    result.backups.append(orig)
            mode = e.path.stat().st_mode & 0o777 if e.path.exists() else 0o644
            atomic_write(e.path, e.new.encode("utf-8"), mode=mode)
            result.written.append(e.path)
    except OSError as exc:
        raise FixError(f"{plan.target}: cannot write ({exc})", hint=_copy_hint(plan.target)) from exc
    except KeyboardInterrupt:  # each file is whole (written atomically), the set is not: say which are done
        from vlmfast.errors import Interrupted

        done = [p.name for p in result.copied + result.backups + result.written]
        raise Interrupted(f"{plan.target}: interrupted after writing {', '.join(done) or 'nothing'}",
                          hint="rerun the same command: it finishes the fix (backups already made are kept)") from None
    return result


def _copy_hint(d: Path) -> str:
    return f"copy the checkpoint somewhere writable and fix the copy: cp -r {d} {d}-fixed && vlmfast fix {d}-fixed"


def _check_writable(plan: FixPlan) -> None:
    # os.access, not a trial write: nothing is written unless everything can be (root ignores modes,
    # and then the OSError path in apply_fix reports a read-only filesystem).
    blocked = [p for p in [plan.target] + [e.path for e in plan.edits if e.old is not None]
               if not os.access(p, os.W_OK)]
    if blocked:
        raise FixError(f"{plan.target}: read-only ({', '.join(p.name for p in blocked)} not writable)",
                       hint=_copy_hint(plan.target))
    for e in plan.edits:
        now = e.path.read_text(encoding="utf-8") if e.path.exists() else None
        if now != e.old:
            raise FixError(f"{e.path}: changed since the fix was planned", hint="run vlmfast fix again")
    for c in plan.copies:
        if c.dst.exists():
            raise FixError(f"{c.dst}: appeared since the fix was planned", hint="run vlmfast fix again")


# -- LoRA merge --------------------------------------------------------------------------------
@dataclass(frozen=True)
class MergeResult:
    out_dir: Path
    base: str  # the base the adapter was merged into
    fixed: tuple[str, ...]  # what the fix pass changed in the merged copy (the base's own problems)


def merge_lora(adapter_dir, out_dir, base=None) -> MergeResult:
    """Merge a LoRA adapter into its base and write a full checkpoint to ``out_dir`` (new or empty):
    weights (merged in float32, saved in the base's dtype), config, the base's generation config and
    processor/tokenizer/chat-template files, then the :func:`plan_fix` fixes. ``base`` defaults to
    the adapter's ``base_model_name_or_path``; a local dir or a hub id (cached)."""
    import torch
    from transformers import AutoModelForImageTextToText
    from transformers.utils import cached_file
    from transformers.utils import logging as hf_logging

    from vlmfast.checkpoints.lora import has_own_processor, load_adapter_model, locate_base, require_adapter_whole

    adapter_dir, out = Path(adapter_dir), Path(out_dir)
    if not is_adapter_dir(adapter_dir) and adapter_dir.is_dir():  # a run dir: its adapter, as doctor and infer find it
        try:
            adapter_dir = require(locate(str(adapter_dir)), "adapter").path
        except CheckpointError:
            pass
    if not is_adapter_dir(adapter_dir):
        raise FixError(f"{adapter_dir}: not a LoRA adapter dir (no adapter_config.json)", hint="point at the adapter dir")
    require_adapter_whole(adapter_dir)  # a cut adapter file: said before the base loads
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FixError(f"{out}: exists and is not empty", hint="choose a new output directory")
    found = locate_base(adapter_dir, base, option="--processor-from")
    base_dir = found.path

    def base_file(name: str) -> Path | None:
        if base_dir is not None:
            return base_dir / name if (base_dir / name).is_file() else None
        cached = cached_file(found.source, name, _raise_exceptions_for_missing_entries=False)
        return Path(cached) if cached else None

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.merging-", dir=out.parent))
    try:
        try:  # safetensors only, as everywhere in vlmfast
            model = AutoModelForImageTextToText.from_pretrained(found.source, dtype=torch.float32, use_safetensors=True)
        except Exception as exc:
            raise FixError(f"{found.source}: cannot load the base model ({type(exc).__name__}: {exc})",
                           hint="check the base path (adapter_config.json or --processor-from) and its weights") from exc
        saved_dtype = _read(base_file("config.json"))
        saved_dtype = saved_dtype.get("dtype") or saved_dtype.get("torch_dtype") or "float32"
        model = load_adapter_model(model, adapter_dir, merge=True)  # merged in float32: no bf16 rounding of B·A
        model.to(getattr(torch, saved_dtype)).save_pretrained(str(tmp))
        # the processor infer runs the adapter with: the adapter dir's own when it has one (a trainer saves its
        # processing class beside the adapter), its chat template the base's only where it has none
        own = has_own_processor(adapter_dir)
        own_template = own and any((adapter_dir / name).is_file() for name in TEMPLATE_FILES)
        for name in ("generation_config.json", *PROCESSOR_GROUP, *TOKENIZER_FILES, *TEMPLATE_FILES):
            from_adapter = own_template if name in TEMPLATE_FILES else own and name != "generation_config.json"
            src = (adapter_dir / name if (adapter_dir / name).is_file() else None) if from_adapter else base_file(name)
            if src is not None:
                shutil.copyfile(src, tmp / name)
        fixed = apply_fix(plan_fix(tmp, processor_from=base_dir), backup=False).plan.changes()
        publish_directory(tmp, out, replace=False)  # never delete what appeared in OUT meanwhile
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    return MergeResult(out, found.source, tuple(c.replace(str(tmp), str(out)) for c in fixed))
