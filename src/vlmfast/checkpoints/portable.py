"""What transformers 4.x cannot read in a checkpoint saved by transformers 5, and the form both lines read.

Trainers on transformers 5 (ms-swift 4, recent TRL and verl) save two settings that 4.57 (what many GRPO
trainers and evaluation environments pin) reads otherwise:

- ``tokenizer_config.json``: ``extra_special_tokens`` as a list. 4.x reads that key as a dict (name →
  token) and stops at "'list' object has no attribute 'keys'". Both lines read the list as
  ``additional_special_tokens``.
- ``config.json``: the rotary settings as ``rope_parameters`` (``rope_theta`` inside). 4.x reads
  ``rope_scaling`` and ``rope_theta``, finds none, and Qwen2.5-VL's attention fails at its first forward
  ("'NoneType' object is not subscriptable"). Both lines read ``rope_scaling`` + ``rope_theta`` written
  beside ``rope_parameters``, which stays, so 5.x reads what it wrote.

Tiny Qwen2-VL, Qwen2.5-VL and Qwen3-VL checkpoints saved by 5.24 and rewritten so decode the same
tokens under 4.57.6 as the originals under 5.24 (checked by hand with ``infer``; tests/checkpoints/
test_portable.py holds Qwen2.5-VL to it on both lines). ``vlmfast fix``
writes the form both lines read; on 4.x the loader reads a checkpoint saved by 5.x through
:func:`readable_here` (the checkpoint is untouched). No rewrite helps a Qwen3-VL-MoE saved by 5.x: its
experts' weights are stored in another layout (4.57 reads ``[experts, 32, 64]`` where 5.x wrote
``[experts, 64, 32]``), so 4.x is refused with what to install instead.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from vlmfast.checkpoints.readers import maybe_json

TOKENIZER_CONFIG, CONFIG = "tokenizer_config.json", "config.json"


def tokenizer_form(config: dict) -> tuple[dict, list[str]]:
    """``config`` (a tokenizer_config.json) with a list of ``extra_special_tokens`` as
    ``additional_special_tokens``, in the same place, after any the file already had; and what changed."""
    listed = config.get("extra_special_tokens")
    if not isinstance(listed, list):
        return config, []
    kept = config.get("additional_special_tokens")
    kept = kept if isinstance(kept, list) else []
    merged = kept + [t for t in listed if t not in kept]
    out = {("additional_special_tokens" if k == "extra_special_tokens" else k): (merged if k == "extra_special_tokens" else v)
           for k, v in config.items() if k != "additional_special_tokens"}
    return out, [f"{TOKENIZER_CONFIG}: extra_special_tokens (a list, as transformers 5 saves it, which 4.x cannot read) "
                 "-> additional_special_tokens (read by 4.x and 5.x)"]


def config_form(config: dict) -> tuple[dict, list[str]]:
    """``config`` (a config.json) with ``rope_scaling`` and ``rope_theta`` beside each ``rope_parameters``
    of mrope rotary settings (the top level and ``text_config``) that lacks them; and what changed."""
    changes = []
    for where, section in (("", config), ("text_config.", config.get("text_config"))):
        rope = section.get("rope_parameters") if isinstance(section, dict) else None
        if not isinstance(rope, dict) or "mrope_section" not in rope or section.get("rope_scaling") is not None:
            continue
        section["rope_scaling"] = {k: v for k, v in rope.items() if k != "rope_theta"}
        if "rope_theta" in rope and "rope_theta" not in section:
            section["rope_theta"] = rope["rope_theta"]
        changes.append(f"{CONFIG}: {where}rope_parameters (as transformers 5 saves them) also as {where}rope_scaling "
                       f"and {where}rope_theta (what 4.x reads)")
    return config, changes


def unreadable_by_v4(d: Path) -> list[str]:
    """What transformers 4.x cannot read in the checkpoint directory ``d``, one line per file ([] for none)."""
    return tokenizer_form(maybe_json(d / TOKENIZER_CONFIG))[1] + config_form(maybe_json(d / CONFIG))[1]


# families whose weights transformers 5 saves in a layout 4.x cannot read (no config rewrite helps)
V5_WEIGHT_LAYOUTS = {"qwen3_vl_moe": "its experts' weights are stored in another layout"}


def v4_cannot_read(d: Path) -> str | None:
    """Why transformers 4.x cannot read the weights of the checkpoint in ``d`` (saved by 5.x), or None."""
    config = maybe_json(d / CONFIG)
    saved = str(config.get("transformers_version", "")).split(".")[0]
    if saved.isdigit() and int(saved) >= 5 and config.get("model_type") in V5_WEIGHT_LAYOUTS:
        return f"saved by transformers {config['transformers_version']}: {V5_WEIGHT_LAYOUTS[config['model_type']]}"
    return None


def transformers_major() -> int:
    import transformers

    return int(transformers.__version__.split(".")[0])


@contextlib.contextmanager
def readable_here(d: Path) -> Iterator[tuple[Path, list[str]]]:
    """``(directory, notes)``: ``d`` itself where the installed transformers reads it; on 4.x, for a
    checkpoint saved by 5.x, a temporary directory of links to ``d``'s entries with the two files rewritten
    (removed on exit; ``d`` is never written), and the note that says so."""
    if transformers_major() >= 5 or not d.is_dir():
        yield d, []
        return
    why = v4_cannot_read(d)
    if why:
        from vlmfast.errors import CheckpointError

        raise CheckpointError(f"{d}: transformers {_installed()} cannot load this checkpoint ({why})",
                              hint="run it where transformers 5 is installed: pip install 'transformers>=5'")
    if not unreadable_by_v4(d):
        yield d, []
        return
    tmp = Path(tempfile.mkdtemp(prefix="vlmfast-v4-form-"))
    try:
        here = tmp / d.name
        here.mkdir()
        rewritten = {}
        for name, form in ((TOKENIZER_CONFIG, tokenizer_form), (CONFIG, config_form)):
            data, changes = form(maybe_json(d / name))
            if changes:
                rewritten[name] = json.dumps(data, indent=2) + "\n"
        for entry in d.iterdir():
            if entry.name not in rewritten:
                os.symlink(entry.absolute(), here / entry.name)
        for name, text in rewritten.items():
            (here / name).write_text(text, encoding="utf-8")
        yield here, [f"{d} was saved by transformers 5: read as transformers {_installed()} reads it "
                     f"({', '.join(sorted(rewritten))} rewritten in a temporary copy; the checkpoint is untouched; "
                     f"vlmfast fix {d} writes the form both lines read)"]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # removes the links, never what they point at


def _installed() -> str:
    import transformers

    return transformers.__version__
