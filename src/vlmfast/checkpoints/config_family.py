"""A config.json of another family than the saved weights: one copied over from another model.

The saved tensor names say which family the weights are
(:func:`~vlmfast.checkpoints.families.family_of_tensors`: Qwen2-VL's vision MLP is ``fc1``/``fc2``,
Qwen2.5-VL's ``gate_proj``/``up_proj``/``down_proj``, the Qwen3 line's ``linear_fc1``/``linear_fc2`` ...).
When that is not the family config.json names, loading builds the wrong model class: it initialises at
random the tensors that class wants and the files lack, and drops the saved ones it does not take. The
lost and unexpected tensors then sit under the same module prefixes (``visual.blocks.0.mlp``) and say
nothing about the save, and the processor, which is the weights' family's, looks like the wrong one.
doctor reports the config instead (``config-family-mismatch``, one error); ``infer`` and ``sweep`` refuse
it whatever ``--allow-missing`` says, since running it means running a randomly initialised part.

Reads safetensors headers and JSON only: no torch, no transformers.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from vlmfast.checkpoints.families import TENSOR_MARKS, Family, family_of, family_of_tensors
from vlmfast.checkpoints.findings import Finding
from vlmfast.errors import CheckpointError

LOCATION = "config.json: model_type"


@dataclass(frozen=True)
class FamilyMismatch:
    """config.json names ``named``, the saved tensors are ``saved``'s (``example``: one saved name that only
    ``saved``'s checkpoints hold); ``patch``: the patch side of the saved patch embedding, when it has one."""

    d: Path
    named: Family
    saved: Family
    model_type: str
    example: str
    patch: int | None = None

    def message(self, check=None) -> str:
        """What is wrong; ``check`` (a :class:`~vlmfast.checkpoints.weights.WeightsCheck` against config.json's
        class) adds how many tensors that class would initialise at random and drop."""
        counts = ""
        if check is not None and (check.missing or check.unexpected):
            lost, dropped = sum(g.count for g in check.missing), sum(g.count for g in check.unexpected)
            counts = f" ({lost} of its {check.expected} tensors not saved, {dropped} saved ones dropped)"
        return (f"config.json names {self.named.name} (model_type {self.model_type!r}) but the saved tensors are "
                f"{self.saved.name}'s (e.g. {self.example}): the config.json was copied from another model, and loading "
                f"would build a {self.named.name} model, initialise at random the parts it does not find and drop "
                f"the saved ones it does not take{counts}")

    def fix(self, base_dir: Path | None = None) -> str:
        """Restore the checkpoint's own config.json: from the trainer's output, else the weights' base."""
        wanted = f"model_type {self.saved.model_types[0]!r}, architectures [{self.saved.model_class!r}]"
        out = (f"restore the checkpoint's own config.json ({wanted}): copy the one the trainer saved with these "
               f"weights, else the {self.saved.name} base model's that the run started from")
        if base_dir is not None and family_of(_config(base_dir)) == self.saved:
            out += f" (cp {shlex.quote(str(Path(base_dir) / 'config.json'))} {shlex.quote(str(self.d))}/)"
        return out

    def finding(self, check=None, base_dir: Path | None = None) -> Finding:
        return Finding("error", "config-family-mismatch", LOCATION, self.message(check), self.fix(base_dir))


def family_mismatch(d, config: dict, index: dict | None = None) -> FamilyMismatch | None:
    """The mismatch between the family config.json names and the one the saved tensors are (``index``: the
    safetensors headers, :func:`~vlmfast.checkpoints.readers.tensor_index`, read here when not given); None
    when they agree, when config.json names a family vlmfast does not know, or when the names are no known
    family's (or the headers cannot be read: said elsewhere)."""
    from vlmfast.checkpoints.readers import tensor_index
    from vlmfast.checkpoints.weight_files import canonical

    named = family_of(config)
    if named is None:
        return None
    if index is None:
        try:
            index = tensor_index(Path(d))
        except (OSError, ValueError, KeyError, TypeError):
            return None
    names = {canonical(n): n for n in index}
    saved = family_of_tensors(names)
    if saved is None or saved == named:
        return None
    marks = TENSOR_MARKS[saved.key]
    mark = next((m for m in marks if m not in TENSOR_MARKS[named.key]), marks[0])  # one that names no other family
    example = next(names[c] for c in sorted(names) if re.search(mark, c))
    return FamilyMismatch(Path(d), named, saved, str(config.get("model_type")), example, _patch(index))


def _patch(index: dict) -> int | None:
    for name, (_, shape, _) in index.items():
        if name.endswith("patch_embed.proj.weight") and len(shape) >= 4 and shape[-1] == shape[-2]:
            return int(shape[-1])
    return None


def _config(d: Path) -> dict:
    from vlmfast.checkpoints.readers import maybe_json

    return maybe_json(Path(d) / "config.json")


def as_saved(d, config: dict) -> dict:
    """``config`` itself, unless the saved tensors are another family's than it names: then a stand-in naming
    the weights' family and the patch size the saved patch embedding has, so that doctor compares the
    processor with the model the files hold (not with the config.json taken from another one)."""
    found = family_mismatch(d, config)
    if found is None:
        return config
    return {"model_type": found.saved.model_types[0], **({"vision_config": {"patch_size": found.patch}} if found.patch else {})}


def refuse_mismatch(d, config: dict, index: dict) -> None:
    """For ``infer`` and ``sweep``: a CheckpointError (exit 2, nothing written) when config.json names another
    family than the saved tensors are; the hint restores the config, never ``--allow-missing``."""
    found = family_mismatch(d, config, index)
    if found is not None:
        raise CheckpointError(f"{d}: {found.message()}", hint=found.fix())


def refuse_other_family(config: dict, d: Path, base: Path) -> None:
    """A CheckpointError when ``base`` (``fix --processor-from``) is a model of another processor or vocabulary than ``d``
    (its ``config``): its processor, tokenizer and EOS ids are another vocabulary's (a Qwen2.5-VL base's EOS ids
    are plain tokens in Qwen3.5's, and its processor cuts 14-pixel patches where Qwen3.5's tower takes 16)."""
    mine = family_of(config)
    theirs = family_of(_config(base)) if (base / "config.json").is_file() else None
    kind = lambda f: (f.processor_class, f.vocabulary, f.patch_size)  # noqa: E731 - an MoE model and its dense kin agree
    if mine is not None and theirs is not None and kind(mine) != kind(theirs):
        raise CheckpointError(f"--processor-from {base}: a {theirs.name} model, but {d} is {mine.name}: its processor, "
                              "tokenizer and EOS ids are another vocabulary's",
                              hint=f"give the {mine.name} base model the run was trained from")
