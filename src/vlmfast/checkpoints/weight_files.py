"""Which weight files of a checkpoint directory transformers loads, and a directory holding two sets.

``from_pretrained`` on a local directory takes the first of ``model.safetensors``,
``model.safetensors.index.json`` (and the shards its ``weight_map`` names), then — only when pickles are
allowed — ``pytorch_model.bin`` and ``pytorch_model.bin.index.json`` (``modeling_utils``'s archive-file
resolution, the same order in 4.57 and 5.x). It reads nothing else: a ``model.safetensors`` left beside a
sharded save wins, and the index and its shards are never opened. vLLM's loader does the opposite (when
an index is there it keeps only the files the index names), so such a directory runs one set of weights on
one engine and the other set on the other. :func:`loaded_files` gives the files transformers reads (what
the weights fingerprint and the whole-weights check look at); :func:`two_sets_said` says when a directory
holds both safetensors sets, and :func:`require_one_set` refuses it. :func:`names_read_by_v4`: the tensors
transformers 4.x reads from a sharded save (only those its index names); :func:`zero_said` and :func:`fsdp_sharded_said`: a checkpoint whose
weights are DeepSpeed ZeRO or FSDP sharded-state-dict shards, never consolidated.

No torch, no transformers, no other vlmfast module but errors: the readers build on it.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

SAFE_SINGLE = "model.safetensors"
SAFE_INDEX = "model.safetensors.index.json"
PICKLE_SINGLE = "pytorch_model.bin"
PICKLE_INDEX = "pytorch_model.bin.index.json"
_NOT_WEIGHTS = ("training_args.bin",)  # HF Trainer pickles its arguments into every checkpoint-N

WRAPPERS = ("model.", "language_model.")  # dropped, in this order, from every name before comparing


def canonical(name: str) -> str:
    """A tensor name without the wrappers transformers maps between saves and classes."""
    for prefix in WRAPPERS:
        if name.startswith(prefix):
            name = name[len(prefix):]
    return name


def _named_by(index: Path) -> list[Path] | None:
    """The files an index's ``weight_map`` names, sorted (None when it names none or cannot be read)."""
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map")
    except (OSError, UnicodeDecodeError, ValueError, AttributeError):
        return None
    if not isinstance(weight_map, dict):
        return None
    names = sorted({n for n in weight_map.values() if isinstance(n, str)})
    return [index.parent / n for n in names] or None


def loaded_files(d, *, pickles: bool = True) -> list[Path]:
    """The full-model weight files ``from_pretrained`` reads from directory ``d``, in transformers' own order
    of preference (module docstring; ``pickles``: whether ``.bin`` files count, as with ``--allow-pickle``).
    A directory no rule matches (shards without their index, other file names) gives every ``*.safetensors``
    (and ``*.bin``) file but adapters' and trainer pickles: what is there, for the checks that report it."""
    d = Path(d)
    if (d / SAFE_SINGLE).is_file():
        return [d / SAFE_SINGLE]
    if (d / SAFE_INDEX).is_file() and (named := _named_by(d / SAFE_INDEX)):
        return named
    if pickles and (d / PICKLE_SINGLE).is_file():
        return [d / PICKLE_SINGLE]
    if pickles and (d / PICKLE_INDEX).is_file() and (named := _named_by(d / PICKLE_INDEX)):
        return named
    patterns = ("*.safetensors", "*.bin") if pickles else ("*.safetensors",)
    return sorted(p for pattern in patterns for p in d.glob(pattern)
                  if not p.name.startswith("adapter_model") and p.name not in _NOT_WEIGHTS)


def loaded_safetensors(d) -> list[Path]:
    """The ``.safetensors`` files among :func:`loaded_files` (whose headers say which tensors are loaded)."""
    return [p for p in loaded_files(d) if p.suffix == ".safetensors"]


@dataclass(frozen=True)
class WeightSet:
    """One complete-looking set of weights: ``model.safetensors``, or the index and the shards it names."""

    label: str  # "model.safetensors" | "model.safetensors.index.json and its 4 shards"
    files: tuple[Path, ...]  # every file of the set (the index too)

    @property
    def newest(self) -> float:
        """The latest modification time among its files (0 when none can be read)."""
        return max((_mtime(p) for p in self.files), default=0.0)

    @property
    def tensors(self) -> int:
        return sum(_tensor_count(p) for p in self.files if p.suffix == ".safetensors")


def _mtime(p: Path) -> float:
    try:
        return p.stat().st_mtime
    except OSError:
        return 0.0


def _tensor_count(p: Path) -> int:
    try:
        with open(p, "rb") as f:
            size = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(size)) if 0 < size < 2**27 else {}
    except (OSError, ValueError):
        return 0
    return len([n for n in header if n != "__metadata__"]) if isinstance(header, dict) else 0


def safetensors_sets(d) -> list[WeightSet]:
    """The safetensors weight sets in ``d``: the single file first (the one transformers loads), then the index's
    (when a shard it names other than ``model.safetensors`` is there)."""
    d = Path(d)
    sets = []
    if (d / SAFE_SINGLE).is_file():
        sets.append(WeightSet(SAFE_SINGLE, (d / SAFE_SINGLE,)))
    shards = [p for p in _named_by(d / SAFE_INDEX) or [] if p.name != SAFE_SINGLE and p.exists()]
    if shards:  # an index whose shards are all absent is an incomplete save (incomplete_weights), not a set
        sets.append(WeightSet(f"{SAFE_INDEX} and its {len(shards)} shard{'s' if len(shards) != 1 else ''}",
                              (d / SAFE_INDEX, *shards)))
    return sets


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else "unknown"


def two_sets_said(d) -> tuple[str, str] | None:
    """(what, fix) when ``d`` holds both ``model.safetensors`` and a sharded set, else None."""
    sets = safetensors_sets(d)
    if len(sets) < 2:
        return None
    single, sharded = sets
    older = min(sets, key=lambda s: s.newest)
    what = (f"two sets of weights: {single.label} ({single.tensors} tensors, newest file {_when(single.newest)}) and "
            f"{sharded.label} ({sharded.tensors} tensors, newest file {_when(sharded.newest)}); transformers (4.57 and "
            f"5.x alike) loads {SAFE_SINGLE} whenever it exists and never reads the index or its shards, while vLLM "
            "loads only the shards the index names: the checkpoint runs different weights on the two engines, and "
            "one set is stale")
    apart = abs(single.newest - sharded.newest) >= 1  # a copy made within the second says nothing
    if apart:
        what += f" (most likely {older.label}, the older one)"
        fix = f"remove the stale set, keeping the one the trainer wrote last: rm {' '.join(p.name for p in older.files)}"
    else:
        fix = (f"remove the stale set (both were written within the same second: the trainer's log says which it "
               f"saved): either rm {SAFE_SINGLE}, or rm {' '.join(p.name for p in sharded.files)}")
    return what, fix


def require_one_set(d) -> None:
    """A CheckpointError (exit 2) when ``d`` holds two safetensors sets (:func:`two_sets_said`)."""
    said = two_sets_said(d)
    if said is not None:
        from vlmfast.errors import CheckpointError

        raise CheckpointError(f"{d}: {said[0]}", hint=said[1])


def names_read_by_v4(d: Path) -> set[str] | None:
    """transformers 4.x loads from a sharded save only the tensors its index's ``weight_map`` names (one a shard
    holds that the index does not name is initialised at random); 5.x loads every tensor of the named shards.
    The names 4.x reads, where 4.x is installed and transformers reads the index; else None (no filter)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        if int(version("transformers").split(".")[0]) >= 5:
            return None
    except (PackageNotFoundError, ValueError):
        return None
    if (d / SAFE_SINGLE).is_file() or not (d / SAFE_INDEX).is_file():
        return None
    try:
        weight_map = json.loads((d / SAFE_INDEX).read_text(encoding="utf-8")).get("weight_map")
    except (OSError, ValueError, AttributeError):
        return None
    return set(weight_map) if isinstance(weight_map, dict) and weight_map else None


def zero_shards(directory) -> Path | None:
    """The DeepSpeed ZeRO checkpoint dir (``global_stepN/`` holding ``*model_states.pt``, the one ``latest`` names
    when it is there) inside a checkpoint dir, or None. HF Trainer under ZeRO-3 without
    ``stage3_gather_16bit_weights_on_model_save`` saves config.json and these shards, never model weights."""
    d = Path(directory)
    try:
        tag = (d / "latest").read_text(encoding="utf-8").strip() if (d / "latest").is_file() else ""
    except (OSError, UnicodeDecodeError):
        tag = ""
    candidates = [d / tag] if tag and "/" not in tag else sorted(d.glob("global_step*"))
    return next((c for c in candidates if c.is_dir() and any(c.glob("*model_states.pt"))), None)


def zero_said(directory) -> tuple[str, str] | None:
    """(what, how to fix) for a checkpoint dir whose weights are DeepSpeed ZeRO shards not consolidated, else None."""
    shards = zero_shards(directory)
    if shards is None:
        return None
    d = Path(directory)
    return (f"no model weights: DeepSpeed ZeRO shards in {shards.name}/ not consolidated (ZeRO-3 saves without "
            "stage3_gather_16bit_weights_on_model_save)",
            f"consolidate them into the checkpoint: python {d / 'zero_to_fp32.py'} {d} {d} --safe_serialization "
            "(DeepSpeed's script, saved beside them), then rerun")


def fsdp_sharded_said(directory) -> tuple[str, str] | None:
    """(what, how to fix) for a checkpoint dir whose model is an FSDP ``SHARDED_STATE_DICT`` save, else None.
    HF Trainer's ``save_model`` writes nothing under FSDP unless the state dict type is FULL_STATE_DICT
    (transformers/trainer.py, ``save_model``); ``_save_checkpoint`` then writes accelerate's
    ``save_fsdp_model`` output, a torch.distributed.checkpoint dir ``pytorch_model_fsdp_0/``
    (accelerate/utils/fsdp_utils.py), and no config.json, tokenizer or processor. ``accelerate merge-weights``
    (accelerate/commands/merge.py) turns it into ``OUT/model.safetensors``."""
    d = Path(directory)
    shards = sorted(p for p in d.glob("pytorch_model_fsdp_*") if p.is_dir())
    if not shards:
        return None
    no_config = not (d / "config.json").is_file()
    return (f"no model weights: an FSDP sharded state dict in {shards[0].name}/ not consolidated (FSDP's "
            f"SHARDED_STATE_DICT saves per-rank distributed-checkpoint files{', and no config.json' if no_config else ''})",
            f"consolidate it into the checkpoint: accelerate merge-weights {shards[0]} {d} (writes "
            f"{d / 'model.safetensors'})" + (", then copy config.json, generation_config.json and the tokenizer and "
                                              f"processor files from the base model into {d}" if no_config else "")
            + ", then rerun")


def shards_said(directory) -> tuple[str, str] | None:
    """(what, how to fix) for a checkpoint dir whose weights are a trainer's shards never consolidated: DeepSpeed
    ZeRO (:func:`zero_said`) or FSDP's sharded state dict (:func:`fsdp_sharded_said`); None otherwise."""
    return zero_said(directory) or fsdp_sharded_said(directory)
