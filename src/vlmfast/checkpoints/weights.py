"""Whole weights: the tensors a checkpoint's safetensors headers name against the tensors its model class
expects, built from its config.json on the meta device (no memory, no weights read).

A save can lose whole groups of tensors while its files look whole (an export that skipped shards, a
vision tower left out, an untied LM head dropped); transformers then initialises the missing ones at
random and says so only in its load log. :func:`check_weights` says which are missing, which the files
hold that the class does not take, and which have another shape, each grouped by the longest prefix all
of whose tensors share the fate (``visual.blocks.1.*: 12 missing``).

Names are compared in one form: transformers renamed the wrappers over the years (``model.layers.0`` in
a Qwen2.5-VL save, ``model.language_model.layers.0`` in its class today, ``visual.*`` beside
``model.visual.*``) and maps one onto the other on load, so the leading ``model.`` and ``language_model.``
are dropped on both sides. A tied LM head (the class's output embedding is its input embedding) may be
saved or not. A saved tensor is compared under the name transformers' loader gives it
(:mod:`vlmfast.checkpoints.expected`): per-expert saves (``experts.0.gate_proj.weight``) supply the fused
``experts.gate_up_proj`` the class holds, as its conversion on load makes it.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from vlmfast.errors import CheckpointError

from vlmfast.checkpoints.expected import Expected, expected_tensors
from vlmfast.checkpoints.weight_files import canonical

_EXPERT = re.compile(r"^(.*\.experts)\.\d+\.")


@dataclass(frozen=True)
class Group:
    """Tensors sharing one fate under ``prefix`` (a whole tensor name when ``count`` is 1 and it is one)."""

    prefix: str
    count: int
    whole_name: bool = False  # prefix is one tensor's full name, not a folder of several

    @property
    def label(self) -> str:
        return self.prefix if self.whole_name else f"{self.prefix}.*"

    def as_dict(self) -> dict:
        return {"prefix": self.label, "count": self.count}


@dataclass(frozen=True)
class WeightsCheck:
    """What :func:`check_weights` found. ``missing``: expected tensors the files lack (``allowed``: those
    of them the user said were expected); ``unexpected``: tensors the class does not take; ``mismatched``:
    (name, saved shape, expected shape)."""

    expected: int
    saved: int
    tied_head: bool
    missing: tuple[Group, ...] = ()
    allowed: tuple[Group, ...] = ()
    unexpected: tuple[Group, ...] = ()
    mismatched: tuple[tuple[str, list, list], ...] = ()
    head_lost: bool = False  # the LM head is untied in the config and its tensor is missing
    notes: tuple[str, ...] = field(default=())

    @property
    def placeholders(self) -> int:
        """Tensors saved empty (0 elements) where the class expects weights: DeepSpeed ZeRO-3's placeholders when
        ``stage3_gather_16bit_weights_on_model_save`` is false (the weights stay in its shards)."""
        empty = sum(1 for _, saved, want in self.mismatched if 0 in saved and 0 not in want)
        # all of them: one empty tensor among real ones is a broken save, not ZeRO-3's
        return empty if empty == len(self.mismatched) and empty * 2 >= self.saved else 0

    @property
    def whole(self) -> bool:
        """Nothing missing (beyond what was allowed) and no shape differs: the weights can be evaluated."""
        return not self.missing and not self.mismatched

    def summary(self) -> str:
        """One line: ``visual.blocks.1.*: 12 missing; lm_head.weight: 1 missing``."""
        parts = [f"{g.label}: {g.count} missing" for g in self.missing]
        if self.placeholders:
            parts.append(f"{self.placeholders} tensor(s) saved empty (shape [0]: DeepSpeed ZeRO-3's placeholders, "
                         "the weights left in its shards)")
        parts += [f"{name}: shape {saved} saved, {want} expected" for name, saved, want in self.mismatched[:3]]
        if len(self.mismatched) > 3:
            parts.append(f"{len(self.mismatched) - 3} more shapes differ")
        return "; ".join(parts)

    def as_dict(self) -> dict:
        return {"whole": self.whole, "expected": self.expected, "saved": self.saved, "tied_head": self.tied_head,
                "missing": [g.as_dict() for g in self.missing], "allowed_missing": [g.as_dict() for g in self.allowed],
                "unexpected": [g.as_dict() for g in self.unexpected],
                "mismatched": [{"name": n, "saved": s, "expected": e} for n, s, e in self.mismatched]}


def check_weights(d: Path, config: dict, index: dict, allow_missing=(), *, apart: bool = False) -> WeightsCheck | None:
    """The checkpoint's tensors (``index``: name → (dtype, shape, bytes), its safetensors headers) against
    what its class expects. ``allow_missing``: prefixes whose missing tensors are expected (``visual``,
    ``lm_head``; a trailing ``.*`` is allowed); ``apart``: see :func:`expected_tensors`. None when no class
    is known for it, or with no safetensors."""
    if not index:
        return None
    expected = expected_tensors(d, config, apart=apart, saved=index)
    if expected is None:
        return None
    return compare(expected, index, allow_missing, quantized="quantization_config" in config)


def compare(expected: Expected, index: dict, allow_missing=(), *, quantized: bool = False) -> WeightsCheck:
    """:func:`check_weights` on an :class:`Expected` (pure: tests give made ones)."""
    saved, parts = {}, {}  # canonical name as loaded → (saved name, shape); → elements of the parts converted into it
    for n, meta in index.items():
        loaded, made = expected.loaded.get(n, (n, False))
        c = canonical(loaded)
        saved.setdefault(c, (n, tuple(meta[1])))
        if made:  # several saved tensors become one (fused experts, concatenated shards): their elements add up
            parts[c] = parts.get(c, 0) + math.prod(meta[1])
    want = dict(expected.tensors)
    if expected.tied_head and expected.head:
        want.pop(expected.head, None)  # tied: the output layer is the input embedding, saved or not
        saved.pop(expected.head, None)
    missing = {c for c in want if c not in saved and not _ignored(want[c][0], expected.ignore_missing)}
    unexpected = {c for c in saved if c not in want and not _ignored(saved[c][0], expected.ignore_unexpected)}
    # per-expert saves of fused expert tensors: transformers fuses them on load
    split_experts = {m.group(1) for c in unexpected if (m := _EXPERT.match(c))}
    missing = {c for c in missing if c.rsplit(".", 1)[0] not in split_experts}
    unexpected = {c for c in unexpected if not ((m := _EXPERT.match(c)) and m.group(1) in split_experts)}
    mismatched = []
    if not quantized:  # quantized saves pack their tensors into other shapes
        for c in sorted(set(want) & set(saved) - set(parts)):
            mine, theirs = saved[c][1], want[c][1]
            transposed = ".experts." in f".{c}" and sorted(mine) == sorted(theirs)  # a fused layout, converted on load
            if mine != theirs and not transposed:
                mismatched.append((saved[c][0], list(mine), list(theirs)))
        for c in sorted(set(want) & set(parts)):  # a shard or an expert lost: the loader refuses the size
            theirs = want[c][1]
            if parts[c] != math.prod(theirs):
                rest = math.prod(theirs[1:])  # what the parts make, as the loader would say it: rows short
                mine = [parts[c] // rest, *theirs[1:]] if theirs and rest and parts[c] % rest == 0 else [parts[c]]
                mismatched.append((want[c][0], mine, list(theirs)))
    style = _style(index)
    allowed = {c for c in missing if _allowed(c, want[c][0], style, allow_missing)}
    head_lost = bool(expected.head) and not expected.tied_head and expected.head in missing
    return WeightsCheck(
        expected=len(want), saved=len(index), tied_head=expected.tied_head,
        missing=tuple(_groups(missing - allowed, set(want), style)), allowed=tuple(_groups(allowed, set(want), style)),
        unexpected=tuple(_groups(unexpected, set(saved), None, {c: saved[c][0] for c in saved})),
        mismatched=tuple(mismatched), head_lost=head_lost and expected.head not in allowed)


def _ignored(name: str, patterns: tuple[str, ...]) -> bool:
    return any(re.search(p, name) for p in patterns)


def _style(index: dict) -> str:
    """How the save names its wrappers: ``new`` (model.language_model.*, model.visual.*), else ``old``
    (model.*, visual.*)."""
    return "new" if any(n.startswith("model.language_model.") for n in index) else "old"


def restyle(name: str, style: str | None) -> str:
    """A canonical name as this save would write it."""
    if style is None or name.startswith(("lm_head", "mtp.")):
        return name
    if name.startswith("visual."):
        return ("model." if style == "new" else "") + name
    return ("model.language_model." if style == "new" else "model.") + name


def _allowed(c: str, model_name: str, style: str, prefixes) -> bool:
    for p in prefixes:
        p = p.removesuffix("*").removesuffix(".")
        if any(n == p or n.startswith(p + ".") for n in (c, model_name, restyle(c, style))):
            return True
    return False


def _groups(members: set[str], universe: set[str], style: str | None, shown: dict | None = None) -> list[Group]:
    """``members`` grouped by the shortest prefix under which every name of ``universe`` is a member."""
    if not members:
        return []
    every, hit = Counter(), Counter()
    for names, counter in ((universe, every), (members, hit)):
        for n in names:
            parts = n.split(".")
            for k in range(1, len(parts) + 1):
                counter[".".join(parts[:k])] += 1
    found: dict[str, int] = {}
    for n in sorted(members):
        parts = n.split(".")
        prefix = next(p for p in (".".join(parts[:k]) for k in range(1, len(parts) + 1)) if hit[p] == every[p])
        found[n if hit[prefix] == 1 else prefix] = hit[prefix]  # one tensor: its own name says more
    groups = []
    for prefix, count in found.items():
        whole = prefix in members
        label = (shown or {}).get(prefix) if whole and shown else None
        if label is None:
            label = restyle(prefix, style) if style else _shown_prefix(prefix, members, shown)
        groups.append(Group(label, count, whole))
    return sorted(groups, key=lambda g: (-g.count, g.prefix))


def _shown_prefix(prefix: str, members: set[str], shown: dict | None) -> str:
    """The prefix as the save writes it: from one of its members' saved names."""
    if not shown:
        return prefix
    member = next(m for m in sorted(members) if m.startswith(prefix + "."))
    return shown[member][: len(shown[member]) - (len(member) - len(prefix))]


def require_whole(found, allow_missing=(), engine: str = "hf") -> WeightsCheck | None:
    """For ``infer`` and ``sweep``: a CheckpointError (exit 2, nothing written) when a local model
    checkpoint's configs cannot be read, its weight files are cut short or absent (checked first: the tensors
    they held are lost to the save, not meant to be missing), it holds two sets of weights (``model.safetensors``
    beside a sharded set), lacks tensors its
    class expects (beyond ``allow_missing``) or holds one of another shape, when its config.json names another
    family than its tensors are, or when an adapter's weight file is not whole; else the check (None when it
    could not be made: a hub id, an adapter, no safetensors, no class). With ``engine`` ``vllm``, also one that
    saves an LM head its config ties (vLLM would run the embedding instead)."""
    if found is not None and found.is_local and found.kind == "adapter":
        from vlmfast.checkpoints.lora import require_adapter_whole

        require_adapter_whole(found.path)  # a cut adapter file: named now, not as peft's error after the base loads
    if found is None or not found.is_local or found.kind != "model":
        return None
    from vlmfast.checkpoints.config_family import refuse_mismatch
    from vlmfast.checkpoints.readers import read_json_object, require_loadable, tensor_index

    d = Path(found.path)
    require_loadable(d)  # two sets, or a file cut short or absent: said as such, not as tensors --allow-missing could pass
    if engine == "vllm":
        from vlmfast.checkpoints.heads import refuse_for_vllm

        refuse_for_vllm(found)
    try:
        index = tensor_index(d)
    except (OSError, ValueError, KeyError, TypeError):
        return None  # an unreadable header is the loader's error to give
    config = read_json_object(d / "config.json")
    refuse_mismatch(d, config, index)  # another model's config.json: not lost tensors, whatever --allow-missing says
    check = check_weights(d, config, index, allow_missing, apart=True)
    if check is not None and not check.whole:
        raise CheckpointError(f"{d}: the weights are not whole: {check.summary()} "
                              f"({check.expected} tensors expected, {check.saved} saved)", hint=fix_hint(check, d))
    return check


def fix_hint(check: WeightsCheck, directory: Path | None = None) -> str:
    """What to do about weights that are not whole (``directory``: the checkpoint, for the command that mends it)."""
    if check.placeholders:
        from vlmfast.checkpoints.weight_files import zero_said

        zero = zero_said(directory) if directory is not None else None
        return ("move the empty model*.safetensors files (and their index) aside, then "
                + (zero[1] if zero else "consolidate the DeepSpeed ZeRO shards with the zero_to_fp32.py script "
                   "DeepSpeed saves beside them") + "; or save again with stage3_gather_16bit_weights_on_model_save true")
    if check.mismatched and not check.missing:
        return "the save does not match its config.json: save again, or take the config.json the weights were saved with"
    # every group, so one rerun suffices (a dozen at most in the hint; the error's list has them all)
    shown = check.missing[:12]
    prefixes = " ".join(f"--allow-missing {g.prefix}" for g in shown) + (
        f" (and one for each of the {len(check.missing) - 12} more groups above)" if len(check.missing) > 12 else "")
    head = ("tie_word_embeddings is false, so the LM head must be saved; " if check.head_lost else "")
    return (f"{head}the save lost these tensors: save again from the trainer's state (or copy frozen ones, e.g. the "
            f"vision tower, from the base model); if they are meant to be missing, {prefixes} runs it with them "
            "initialised at random (on vlmfast's own engine: vLLM loads whole weights only)")


def compare_with_base(index: dict, base_index: dict) -> str:
    """The saved tensors against the base's (both safetensors indexes), grouped: what the base has that this
    save lacks, what only this save has, and shapes that differ (the vocabulary rows of the embedding and
    the head aside: doctor's vocabulary check says those). Empty when they agree."""
    mine = {canonical(n): tuple(meta[1]) for n, meta in index.items()}
    theirs = {canonical(n): tuple(meta[1]) for n, meta in base_index.items()}
    style = _style(index)
    parts = [f"{g.label}: {g.count} in the base, not here" for g in _groups(set(theirs) - set(mine), set(theirs), style)]
    parts += [f"{g.label}: {g.count} here, not in the base" for g in _groups(set(mine) - set(theirs), set(mine), style)]
    vocab = ("embed_tokens.weight", "lm_head.weight")
    shapes = [c for c in sorted(set(mine) & set(theirs)) if mine[c] != theirs[c]
              and not (c.endswith(vocab) and mine[c][1:] == theirs[c][1:])]
    parts += [f"{restyle(c, style)}: shape {list(mine[c])} here, {list(theirs[c])} in the base" for c in shapes]
    return "; ".join(parts[:6]) + (f"; and {len(parts) - 6} more" if len(parts) > 6 else "")

