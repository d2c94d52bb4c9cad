"""A temporary, fixed view of a checkpoint for vLLM; the checkpoint itself is never modified.

vLLM never reads ``use_cache``, but GRPO checkpoints break it in the other ways :func:`vlmfast.checkpoints.fix.plan_fix`
plans for: processor/tokenizer/chat-template files missing, and an EOS list without ``<|im_end|>``.
:func:`overlay_for_vllm` builds a directory of symlinks to every entry of the checkpoint, where the files
the plan would edit are patched copies and the files it would copy are links into the base model. vLLM
(and the processor vlmfast loads beside it) read that directory instead of the checkpoint.

A LoRA adapter directory is merged into its base with :func:`vlmfast.checkpoints.fix.merge_lora`, into the overlay's
temporary directory (vLLM's own LoRA path, ``enable_lora`` + ``LoRARequest``, covers the language layers
only unless ``enable_tower_connector_lora``, and needs ``max_lora_rank`` set to the adapter's rank; a
merged copy runs every adapter exactly as the HF engine's ``--merge`` does).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from vlmfast.checkpoints.readers import PROCESSOR_CONFIGS, has_processor_config
from vlmfast.checkpoints.fix import plan_fix
from vlmfast.checkpoints.locate import located, require

OVERLAY_PREFIX = "vlmfast-vllm-overlay-"


@contextlib.contextmanager
def overlay_for_vllm(ckpt_dir, base=None) -> Iterator[tuple[Path, list[str]]]:
    """``(path, notes)``: a temporary directory vLLM can load in place of ``ckpt_dir`` (a checkpoint
    already :class:`~vlmfast.checkpoints.locate.Located`, or a local model dir, a trainer output dir
    resolved as everywhere in vlmfast, or a LoRA adapter dir), and one note
    per thing it changed or could not change. ``base`` (the base model dir) supplies missing processor,
    tokenizer and chat-template files, its EOS list, and for an adapter the model to merge into.
    The directory is removed on exit; nothing is ever written into ``ckpt_dir`` or ``base``."""
    tmp = Path(tempfile.mkdtemp(prefix=OVERLAY_PREFIX))
    try:
        yield build_overlay(ckpt_dir, tmp, base=base)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # removes the links, never what they point at


def build_overlay(ckpt_dir, into, base=None) -> tuple[Path, list[str]]:
    """Build the overlay inside the existing, empty directory ``into`` (the caller removes it)."""
    into = Path(into)
    found = located(ckpt_dir)
    notes = [found.note] if getattr(found, "note", None) else []
    if found.kind == "adapter":
        from vlmfast.checkpoints.fix import merge_lora

        merged = merge_lora(found.path, into / "merged", base=base)
        notes.append(f"LoRA adapter {found.path} merged into {merged.base} for vLLM (a temporary full copy; "
                     "the adapter is untouched)")
        notes += [f"merged copy: {change}" for change in merged.fixed]
        return merged.out_dir, notes
    require(found, "model")  # anything else: the CheckpointError that says what to do

    plan = plan_fix(found, processor_from=base)
    target = Path(plan.target).absolute()
    out = into / target.name
    out.mkdir()
    replaced: dict[str, tuple[str, object]] = {}
    for copy in plan.copies:
        replaced[_top_level(copy.dst, target)] = ("link", Path(copy.src).absolute())
    for edit in plan.edits:
        replaced[_top_level(edit.path, target)] = ("write", edit.new)
    for entry in sorted(target.iterdir()):
        if entry.name not in replaced:
            os.symlink(entry.absolute(), out / entry.name)
    for name, (how, what) in sorted(replaced.items()):
        if how == "link":
            os.symlink(what, out / name)
        else:
            (out / name).write_text(what, encoding="utf-8")
    notes += [f"overlay for vLLM (the checkpoint is untouched): {change}" for change in plan.changes()]
    if not has_processor_config(out):
        notes.append(f"{target} has no processor config ({' / '.join(PROCESSOR_CONFIGS)}) and no base supplied "
                     "one: pass the base model dir as base (--base / --processor-from)")
    return out, notes


def _top_level(path, target: Path) -> str:
    rel = Path(path).absolute().relative_to(target)
    if len(rel.parts) != 1:  # plan_fix only touches files at the top of the checkpoint
        raise ValueError(f"overlay: {path} is not a top-level file of {target}")
    return rel.parts[0]
