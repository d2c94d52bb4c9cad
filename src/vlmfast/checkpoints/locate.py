"""Find the checkpoint a user means: a model dir, a trainer output dir, a LoRA adapter dir, or a hub id.

:func:`locate` is the one way every command finds a checkpoint. It loads nothing and imports neither
torch nor transformers, so a wrong path is reported in well under a second. :func:`require` turns the
kinds a caller cannot use (an adapter where a full model is needed, unmerged FSDP shards, a save
without weights, a hub id where a local dir is needed) into errors whose hint says what to do.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from vlmfast.checkpoints.readers import (adapter_base_or_none, has_weights, is_adapter_dir, read_json_object,
                                         weights_complete)
from vlmfast.checkpoints.weight_files import fsdp_sharded_said, shards_said, zero_said
from vlmfast.errors import CheckpointError

CHECKPOINT_DIR = re.compile(r"^checkpoint-(\d+)$")
MERGED_DIR = re.compile(r"^checkpoint-(\d+)-merged$")  # ms-swift export --merge_lora: "<adapter dir>-merged"
GLOBAL_STEP_DIR = re.compile(r"^global_step_(\d+)$")  # EasyR1 / verl
SWIFT_RUN_DIR = re.compile(r"^v(\d+)-")  # ms-swift: output/v0-20250101-120000/checkpoint-N
FSDP_SHARDS = "model_world_size_*_rank_*.pt"  # EasyR1 per-rank model shards, beside huggingface/
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
HUB_TIMEOUT_S = 10.0  # one metadata request; transformers' own retries took minutes on a dead network
KINDS = ("model", "adapter", "fsdp", "incomplete", "hub")


@dataclass(frozen=True)
class Located:
    """Where a checkpoint lives. ``kind``: ``model`` (config + weights), ``adapter`` (LoRA adapter dir),
    ``fsdp`` (EasyR1 ``huggingface/`` dir whose weights are still the per-rank ``shards`` beside it),
    ``incomplete`` (config.json, no weights) or ``hub`` (a hub id, ``path`` None)."""

    path: Path | None
    kind: str
    note: str | None = None
    shards: tuple[Path, ...] = ()
    hub_id: str | None = None

    @property
    def source(self) -> str:
        """What ``from_pretrained`` takes: the directory, or the hub id."""
        return self.hub_id if self.path is None else str(self.path)

    @property
    def is_local(self) -> bool:
        return self.path is not None


def locate(spec, *, hub: bool = False, option: str | None = None) -> Located:
    """The checkpoint ``spec`` names. Directories are walked down to the model they hold
    (:func:`walk`); a hub id is accepted only with ``hub`` (and then probed once, quickly: a missing
    repo and an unreachable hub are different errors). Raises CheckpointError otherwise, its message
    led by ``option`` (the flag that named it, e.g. ``--base``) when given."""
    try:
        return _locate(spec, hub)
    except CheckpointError as exc:
        if option:
            exc.message = f"{option} {exc.message}"
            exc.args = (exc.message,)
        raise


def _locate(spec, hub: bool) -> Located:
    text = str(spec)
    if not text.strip():  # Path("") is the current directory: an unset shell variable would check that
        raise CheckpointError("empty text (an unset shell variable?), not a checkpoint", hint="give the checkpoint's directory")
    path = Path(text).expanduser()
    if path.is_dir():
        if not os.access(path, os.R_OK | os.X_OK):
            raise CheckpointError(f"{path}: directory is not readable (permissions)", hint="check the owner and mode of the directory")
        return walk(path)
    if path.exists():
        raise CheckpointError(f"{path}: is a file, not a checkpoint directory", hint="point at the directory holding config.json")
    if is_hub_id(text):
        if not hub:
            raise CheckpointError(
                f"{text}: no such directory (read as a hub id org/name, it would need downloading: this command "
                "reads local directories only)",
                hint=f"check the path; for a hub model: huggingface-cli download {text} --local-dir DIR, then pass DIR",
            )
        return probe_hub(text)
    raise CheckpointError(f"{text}: no such directory", hint="check the path" + ("; hub ids look like org/name" if hub else ""))


def is_hub_id(spec: str) -> bool:
    """``org/name``, where ``org`` is not a local directory."""
    return bool(HUB_ID.match(spec)) and not Path(spec.split("/")[0]).is_dir()


def located(spec, *, hub: bool = False, option: str | None = None) -> Located:
    """``spec`` itself when it is already :class:`Located` (a checkpoint is located once, where a run
    starts, and travels down), else :func:`locate` of it."""
    return spec if isinstance(spec, Located) else locate(spec, hub=hub, option=option)


def require(found: Located, *kinds: str) -> Located:
    """``found`` if its kind is one of ``kinds``; otherwise the CheckpointError that says why it cannot
    be used here and what to do about it."""
    if found.kind in kinds:
        return found
    if found.kind == "adapter":
        base = adapter_base_or_none(found.path) or "not named"
        raise CheckpointError(
            f"{found.path}: a LoRA adapter (base: {base}), not a full model",
            hint=f"run it on its base (infer --ckpt {found.path} --base BASE), or merge it: vlmfast fix {found.path} --merge-lora OUT",
        )
    if found.kind == "fsdp":
        raise CheckpointError(
            f"{found.path.parent}: {len(found.shards)} FSDP shards ({found.shards[0].name}, ...) not merged; "
            f"{found.path} has config.json but no weights",
            hint=fsdp_merge_hint(found),
        )
    if found.kind == "incomplete" and (shards := shards_said(found.path)) is not None:
        raise CheckpointError(f"{found.path}: {shards[0]}", hint=shards[1])
    if found.kind == "incomplete":
        raise CheckpointError(
            f"{found.path}: config.json but no weights (*.safetensors / *.bin)",
            hint="the save may be incomplete, or weights are sharded per rank and need merging",
        )
    raise CheckpointError(f"{found.source}: a hub id, but a local directory is needed here",
                          hint=f"download it first (huggingface-cli download {found.source} --local-dir DIR), then pass DIR")


def fsdp_merge_hint(found: Located, then: str | None = None) -> str:
    """How to turn per-rank FSDP shards into a loadable checkpoint: verl's merger (an actor dir with verl's
    fsdp_config.json) writes where --target_dir says; EasyR1's into actor/huggingface. ``then``: what to do
    next (default: point --ckpt at the merged dir; a sweep, which has no --ckpt, says to rerun it)."""
    actor = found.path.parent
    then = then or f"point --ckpt at {found.path}"
    if (actor / "fsdp_config.json").is_file():
        return (f"merge the shards with verl: python -m verl.model_merger merge --backend fsdp --local_dir {actor} "
                f"--target_dir {found.path}, then {then}")
    return (f"merge the shards with EasyR1: python3 scripts/model_merger.py --local_dir {actor} "
            f"(it writes the weights into {found.path}), then {then}")


# -- directories ---------------------------------------------------------------------------------
def walk(path: Path) -> Located:
    """Walk a local directory down to the model it holds, loading nothing: a model dir; a LoRA adapter
    dir; ``checkpoint-N`` (HF Trainer, VLM-R1: highest N with weights); EasyR1
    ``global_step_N/actor/huggingface``; ms-swift ``vX-*/checkpoint-N`` (highest version with weights).
    Raises CheckpointError when nothing there looks like a checkpoint."""
    if (path / "config.json").is_file() and has_weights(path):
        numbered = checkpoint_subdirs(path)
        inside = [d.name for _, d in numbered]  # a trainer's final save at the top
        if numbered and not weights_complete(path):  # the final save still being written (or cut short): the
            try:  # highest complete checkpoint-N, as for a run without a final save, and the top one said skipped
                found = _highest(path, numbered, "checkpoint-N")
            except CheckpointError:
                found = None
            if found is not None and found.kind in ("model", "adapter"):
                note = (f"{found.note}; skipped the model saved at the top of {path.name}/ (a trainer's final save): "
                        "weights incomplete: a save cut short or still being written")
                return Located(found.path, found.kind, note, found.shards)
        return Located(path, "model", f"using the model saved at the top of {path.name}/ (a trainer's final save), not "
                       f"its {', '.join(inside[:3])}{' …' if len(inside) > 3 else ''} (give one as --ckpt for it)"
                       if inside else None)
    if is_adapter_dir(path):
        return Located(path, "adapter")
    for sub in ("huggingface", "actor/huggingface"):  # EasyR1 actor/ and global_step_N/
        if (path / sub / "config.json").is_file():
            found = walk(path / sub)
            return Located(found.path, found.kind, f"using {sub}", found.shards)
    for numbered, label in ((checkpoint_subdirs(path), "checkpoint-N"), (numbered_subdirs(path, GLOBAL_STEP_DIR), "global_step_N")):
        if numbered:
            return _highest(path, numbered, label)
    if runs := numbered_subdirs(path, SWIFT_RUN_DIR):
        return _latest_swift_run(path, runs)
    if (path / "config.json").is_file():
        shards = tuple(sorted(path.parent.glob(FSDP_SHARDS))) if path.name == "huggingface" else ()
        return Located(path, "fsdp" if shards else "incomplete", shards=shards)
    if (sharded := fsdp_sharded_said(path)) is not None:
        raise CheckpointError(f"{path}: {sharded[0]}", hint=sharded[1])
    raise CheckpointError(
        f"{path}: not a checkpoint (no config.json, no checkpoint-N subdirectories)",
        hint="point at the model directory (the one holding config.json)",
    )


def numbered_subdirs(path: Path, pattern: re.Pattern) -> list[tuple[int, Path]]:
    """``(number, dir)`` for the subdirectories whose name matches ``pattern`` (group 1 a number),
    highest number first."""
    return sorted(
        ((int(m.group(1)), child) for child in path.iterdir() if child.is_dir() and (m := pattern.match(child.name))),
        key=lambda item: (item[0], item[1].name), reverse=True,
    )


def checkpoint_subdirs(path: Path) -> list[tuple[int, Path]]:
    """``(step, dir)`` for the ``checkpoint-N`` subdirectories, and ``checkpoint-N-merged`` for a step whose
    ``checkpoint-N`` is not there (ms-swift's ``swift export --merge_lora`` writes the merged model beside the
    adapter as ``<adapter dir>-merged``, and the adapter dir may be deleted after), highest step first. With
    both there, the adapter dir stands for the step (:func:`_highest` and the sweep take the merged one beside it)."""
    numbered = numbered_subdirs(path, CHECKPOINT_DIR)
    steps = {n for n, _ in numbered}
    merged = [(n, d) for n, d in numbered_subdirs(path, MERGED_DIR) if n not in steps]
    return sorted(numbered + merged, key=lambda item: (item[0], item[1].name), reverse=True)


def fsdp_sharded_dir(ckpt) -> Path | None:
    """The checkpoint dir holding an FSDP sharded state dict that ``ckpt`` names (itself, or a run dir's highest
    checkpoint-N holding one), else None. Such a save has no config.json, so locate finds no model in it; doctor
    reports it as a finding with the command that consolidates it."""
    path = Path(str(ckpt)).expanduser()
    if not path.is_dir():
        return None
    return next((d for d in [path] + [d for _, d in checkpoint_subdirs(path)] if fsdp_sharded_said(d) is not None), None)


SKIP_REASONS = {"incomplete": "config.json but no weights", "fsdp": "unmerged FSDP shards"}


def _highest(path: Path, numbered: list[tuple[int, Path]], label: str) -> Located:
    located, why, refused = [], {}, {}
    for n, child in numbered:
        try:
            located.append((n, child, walk(child)))
        except CheckpointError as exc:
            refused[child.name] = exc
            why[child.name] = ("FSDP sharded state dict not consolidated" if fsdp_sharded_said(child) is not None
                               else "no config.json")
    why.update({d.name: "DeepSpeed ZeRO shards not consolidated" if f.kind == "incomplete" and zero_said(f.path)
                else "FSDP sharded state dict not consolidated" if f.kind == "incomplete" and fsdp_sharded_said(f.path)
                else SKIP_REASONS[f.kind] for _, d, f in located if f.kind in SKIP_REASONS})
    cut = {d.name for _, d, f in located if f.kind in ("model", "adapter") and not weights_complete(f.path)}
    why.update({name: "weights incomplete: a save cut short or still being written" for name in cut})
    for _, d, f in located:  # a config file cut short: a save interrupted as surely as cut weights
        if f.kind in ("model", "adapter") and d.name not in cut and (broken := _unreadable_config(f.path)):
            cut.add(d.name)
            why[d.name] = f"{broken} unreadable: a save cut short?"
    usable = [(n, d, found) for n, d, found in located if found.kind in ("model", "adapter") and d.name not in cut]
    if usable:
        n, chosen, found = usable[0]
        merged = chosen.with_name(chosen.name + "-merged")  # ms-swift export --merge_lora writes it beside
        if found.kind == "adapter" and (merged / "config.json").is_file() and has_weights(merged):
            found = Located(merged, "model")
        where = found.path.relative_to(path).as_posix()
        note = f"using {where} (highest of {len(usable)} {label} dirs with complete weights in {path})"
        skipped = [f"{d.name} ({why.get(d.name, 'no weights')})" for m, d in numbered if m > n]
        if skipped:
            note += f"; skipped {', '.join(skipped)}"
        return Located(found.path, found.kind, note, found.shards)
    unmerged = [found for _, _, found in located if found.kind == "fsdp"]
    if unmerged:  # EasyR1 before model_merger.py: say so rather than "no weights"
        found = unmerged[0]
        return Located(found.path, "fsdp", f"using {found.path.relative_to(path).as_posix()} (highest {label})", found.shards)
    sharded = [found for _, _, found in located if found.kind == "incomplete" and shards_said(found.path)]
    if sharded:  # DeepSpeed ZeRO-3 shards beside config.json: the highest, whose require() and doctor name the command
        found = sharded[0]
        return Located(found.path, "incomplete", f"using {found.path.relative_to(path).as_posix()} (highest {label}; "
                       f"{why[found.path.name]})")
    listed = ", ".join(f"{d.name} ({why.get(d.name, 'no weights')})" for _, d in numbered[:5])
    own = next((refused[d.name] for _, d in numbered if d.name in refused and fsdp_sharded_said(d) is not None), None)
    raise CheckpointError(  # an FSDP sharded save has no config.json: its own message and command, not a generic one
        f"{path}: none of its {label} dirs holds config.json and weights: {listed}"
        + (f"; {own.message}" if own is not None else ""),
        hint=own.hint if own is not None else "point at a directory with config.json and *.safetensors; merge FSDP/LoRA "
                                              "outputs first",
    )


def _unreadable_config(d: Path) -> str | None:
    """The name of ``d``'s config file that is not a JSON object, if one is not."""
    for name in ("config.json", "generation_config.json", "adapter_config.json"):
        if (d / name).is_file():
            try:
                read_json_object(d / name)
            except CheckpointError:
                return name
    return None


def _latest_swift_run(path: Path, runs: list[tuple[int, Path]]) -> Located:
    for _, run in runs:
        try:
            found = walk(run)
        except CheckpointError:
            continue
        if found.kind in ("model", "adapter"):
            where = found.path.relative_to(path).as_posix()
            return Located(found.path, found.kind, f"using {where} (latest ms-swift run with weights, highest checkpoint-N)")
    raise CheckpointError(
        f"{path}: none of its ms-swift runs ({', '.join(r.name for _, r in runs[:5])}) holds a checkpoint-N with weights",
        hint="point at a vX-*/checkpoint-N directory that holds weights or a LoRA adapter",
    )


# -- the hub -------------------------------------------------------------------------------------
def probe_hub(repo_id: str, timeout: float = HUB_TIMEOUT_S) -> Located:
    """One metadata request for ``repo_id``, so that "no such repo" and "no network" fail within
    seconds and say which. With the hub unreachable (or HF_HUB_OFFLINE set) a copy in the local
    Hugging Face cache is used from its snapshot directory, said aloud."""
    from huggingface_hub import HfApi, constants, try_to_load_from_cache
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    cached = try_to_load_from_cache(repo_id, "config.json")
    snapshot = Path(cached).parent if isinstance(cached, str) else None
    if constants.HF_HUB_OFFLINE:
        if snapshot is not None:
            return Located(snapshot, "model", f"{repo_id}: from the local Hugging Face cache (HF_HUB_OFFLINE is set)")
        raise CheckpointError(
            f"{repo_id}: no such directory, and as a hub id it is not in the local Hugging Face cache "
            "(HF_HUB_OFFLINE is set)",
            hint=f"check the path; for a hub model: download it where the hub is reachable (huggingface-cli download "
                 f"{repo_id} --local-dir DIR) and pass DIR, or unset HF_HUB_OFFLINE",
        )
    try:
        HfApi().model_info(repo_id, timeout=timeout)
    except GatedRepoError as exc:
        raise CheckpointError(f"{repo_id}: a gated repo on the hub; this account has no access",
                              hint="accept its terms on the model page, then log in: hf auth login") from exc
    except RepositoryNotFoundError as exc:
        raise CheckpointError(f"{repo_id}: no such model on the hub ({constants.ENDPOINT})",
                              hint="check the id (org/name); a private repo needs a login: hf auth login") from exc
    except Exception as exc:  # connection refused, DNS, proxy, timeout, 5xx: the hub is not reachable
        if snapshot is not None:
            return Located(snapshot, "model", f"{repo_id}: the hub is unreachable ({type(exc).__name__}); using the cached copy")
        raise CheckpointError(
            f"{repo_id}: no such directory, and as a hub id the hub at {constants.ENDPOINT} cannot be reached "
            f"({type(exc).__name__})",
            hint="check the path; for a hub model: check the network or proxy (HTTPS_PROXY), or download it where the "
                 "hub is reachable and pass its directory; HF_HUB_OFFLINE=1 uses models already in the local cache",
        ) from exc
    return Located(None, "hub", "hub id", hub_id=repo_id)
