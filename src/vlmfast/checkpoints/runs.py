"""Every checkpoint of a training run, in step order, for a sweep.

A run directory is what a trainer writes into: HF Trainer's ``checkpoint-N/`` (VLM-R1, TRL),
ms-swift's ``vX-YYYYMMDD-HHMMSS/checkpoint-N/``, EasyR1 / verl's ``global_step_N/actor/huggingface/``.
Each numbered dir is classified by :func:`vlmfast.checkpoints.locate.walk`, the same rules that find one
checkpoint; what cannot be evaluated is listed as skipped, with the reason and what to do. Loads
nothing and imports neither torch nor transformers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from vlmfast.checkpoints.readers import (corrupt_weights, has_weights, incomplete_adapter, incomplete_said, is_adapter_dir,
                                         maybe_json, weights_complete)
from vlmfast.checkpoints.weight_files import fsdp_sharded_said, shards_said
from vlmfast.errors import CheckpointError, InputError
from vlmfast.checkpoints.locate import (FSDP_SHARDS, GLOBAL_STEP_DIR, SWIFT_RUN_DIR, Located, checkpoint_subdirs,
                                        fsdp_merge_hint, numbered_subdirs, walk)

LAYOUTS = ("hf-trainer", "ms-swift", "easyr1", "lora")
LOOKED_FOR = "checkpoint-N/, vX-*/checkpoint-N/ (ms-swift) or global_step_N/actor/huggingface/ (EasyR1, verl)"


@dataclass(frozen=True)
class RunCheckpoint:
    """One checkpoint of the run: its training ``step``, the directory to load, and ``layout`` (one of
    :data:`LAYOUTS`; ``lora`` for an adapter dir, whatever trainer wrote it)."""

    step: int
    path: Path
    layout: str


@dataclass(frozen=True)
class Skipped:
    """A directory that looked like a checkpoint but cannot be evaluated as it is; ``hint`` says what to do."""

    path: Path
    step: int | None
    reason: str
    hint: str | None = None
    pending: bool = False  # ``complete_only``: not fully written yet, evaluated once it is


@dataclass(frozen=True)
class RunListing:
    """The run's checkpoints ordered by step, and what was skipped."""

    run_dir: Path
    checkpoints: list[RunCheckpoint] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)

    @property
    def steps(self) -> list[int]:
        """The steps of :attr:`checkpoints`, in order."""
        return [c.step for c in self.checkpoints]


def find_run_checkpoints(run_dir, *, steps: Sequence[int] | None = None, complete_only: bool = False) -> RunListing:
    """Every checkpoint under ``run_dir``, ordered by step (numerically).

    ms-swift: the checkpoints of the latest ``vX-…`` run that has any (older runs' are listed as
    skipped). EasyR1 / verl steps whose ``actor/`` holds only FSDP shards are skipped with the merge
    command as hint. A LoRA adapter checkpoint has layout ``lora`` (a ``checkpoint-N-merged`` beside it
    is used instead; one whose adapter dir is gone is step N's model). HF Trainer's final model saved in ``run_dir`` itself counts at the step its
    ``trainer_state.json`` records, when that step has no checkpoint-N.

    ``steps`` keeps those steps only; a step not found is an InputError listing the steps found.
    ``complete_only`` (for watching a run that is still training) lists checkpoints whose weights are not
    fully written yet (:func:`weights_complete`) and numbered dirs without weights as ``pending`` skips;
    it then returns an empty listing instead of raising when nothing is ready, and a requested step that
    is not there yet is not an error. Raises InputError when ``run_dir`` is not
    a directory, is itself one checkpoint, or holds no checkpoint."""
    root = Path(run_dir).expanduser()
    if not root.is_dir():
        raise InputError(f"{root}: no such directory", hint="give the trainer's output directory")
    checkpoints, skipped = _scan(root, complete_only)
    if checkpoints is None:
        if _is_single_checkpoint(root):
            raise InputError(f"{root}: a single checkpoint, not a training run with checkpoints",
                             hint=f"evaluate it with: vlmfast infer --ckpt {root}")
        if complete_only:
            return RunListing(root)
        raise InputError(f"{root}: no checkpoints found (looked for {LOOKED_FOR})",
                         hint="give the directory the trainer saved its checkpoints into (its output_dir)")
    checkpoints.sort(key=lambda c: (c.step, c.path.name))
    skipped.sort(key=lambda s: (s.step is None, s.step or 0, str(s.path)))
    if not checkpoints and not complete_only:
        first = next((s for s in skipped if s.hint), skipped[0] if skipped else None)
        problems = [f"{s.path}: {s.reason}" for s in skipped]
        # each reason in the message itself, as a bad input's list is: the terminal shows message and hint only
        said = (f" ({first.path.name}: {first.reason})" if len(skipped) == 1 else
                ":\n" + "\n".join(f"  - {p}" for p in problems) if skipped else "")
        hints = list(dict.fromkeys(s.hint for s in skipped if s.hint))
        hint = (hints[0] if len(hints) == 1 else "; ".join(f"{s.path.name}: {s.hint}" for s in skipped if s.hint)
                if hints else "point at a run whose checkpoints hold weights")
        raise InputError(f"{root}: none of its checkpoint dirs can be evaluated{said}", hint=hint, problems=problems)
    if steps is not None:
        checkpoints, skipped = _keep_steps(root, checkpoints, skipped, steps, complete_only)
    return RunListing(root, checkpoints, skipped)


def _keep_steps(root: Path, checkpoints, skipped, steps: Sequence[int], complete_only: bool):
    wanted = {int(s) for s in steps}
    found = [c.step for c in checkpoints]
    missing = sorted(wanted - set(found))
    if missing and not complete_only:
        why = [f"step {s.step}: {s.reason}" for s in skipped if s.step in missing]
        raise InputError(f"{root}: no checkpoint for step {', '.join(map(str, missing))}" +
                         (f" ({'; '.join(why)})" if why else ""),
                         hint=f"steps found: {', '.join(map(str, found)) or 'none'}")
    return ([c for c in checkpoints if c.step in wanted],
            [s for s in skipped if s.step is None or s.step in wanted])


def _scan(root: Path, complete_only: bool):
    """(checkpoints, skipped) of the layout found in ``root``; checkpoints None when none is found."""
    if numbered := checkpoint_subdirs(root):
        swift = bool(SWIFT_RUN_DIR.match(root.name)) or (root / "args.json").is_file()
        checkpoints, skipped = _classify_all(numbered, "ms-swift" if swift else "hf-trainer", complete_only)
        _final_model(root, checkpoints, skipped, complete_only)
        return checkpoints, skipped
    if numbered := numbered_subdirs(root, GLOBAL_STEP_DIR):
        return _classify_all(numbered, "easyr1", complete_only)
    if runs := numbered_subdirs(root, SWIFT_RUN_DIR):
        return _swift_runs(runs, complete_only)
    return None, []


def _classify_all(numbered: list[tuple[int, Path]], layout: str, complete_only: bool):
    """Each numbered dir classified. Two dirs of one step (``checkpoint-100`` and ``checkpoint-0100``) would write
    one ``step-100.jsonl``, the second replacing the first's rows as if its weights had changed: the first (the
    plain spelling, which sorts first) stands for the step, the other is listed as skipped."""
    checkpoints, skipped, seen = [], [], {}
    for step, d in numbered:
        if step in seen:
            skipped.append(Skipped(d, step, f"another dir of step {step} ({seen[step].name}) stands for it: one step, one "
                                   "results file", f"rename or move {d.name} aside to evaluate it"))
            continue
        seen[step] = d
        found = _classify(step, d, layout, complete_only)
        if isinstance(found, RunCheckpoint):
            checkpoints.append(found)
        elif found is not None:
            skipped.append(found)
    return checkpoints, skipped


def _classify(step: int, d: Path, layout: str, complete_only: bool) -> RunCheckpoint | Skipped | None:
    """One numbered dir as a checkpoint, a skip, or None (not written yet, with ``complete_only``)."""
    try:
        found = walk(d)
    except CheckpointError:
        if shards := sorted((d / "actor").glob(FSDP_SHARDS)):
            return _unmerged(step, d, Located(d / "actor" / "huggingface", "fsdp", shards=tuple(shards)))
        if (sharded := fsdp_sharded_said(d)) is not None:  # never consolidated by the trainer: nothing to wait for
            return Skipped(d, step, sharded[0], sharded[1])
        # model weights without the config that says their model (an optimizer.bin or training_args.bin is not)
        if any(next(d.glob(g), None) for g in ("*.safetensors", "pytorch_model*.bin", "model*.bin")):
            return Skipped(d, step, "weights but no config.json", "the save was interrupted or is still being written; "
                           "or copy the base model's config.json beside them", pending=complete_only)
        return Skipped(d, step, "no config.json and no weights", pending=complete_only)
    if found.kind == "fsdp":
        return _unmerged(step, d, found)
    if found.kind == "incomplete" and (sharded := shards_said(found.path)) is not None:
        return Skipped(d, step, sharded[0], sharded[1])  # never written by the trainer: nothing to wait for
    if found.kind not in ("model", "adapter"):
        return Skipped(d, step, "config.json but no weights (*.safetensors / *.bin)",
                       "the save was interrupted or is still being written", pending=complete_only)
    path, kind = found.path, found.kind
    merged = d.with_name(d.name + "-merged")  # ms-swift export --merge_lora writes it beside the adapter
    if kind == "adapter" and (merged / "config.json").is_file() and has_weights(merged):
        path, kind = merged, "model"
    if not weights_complete(path):  # a save cut short (or still being written): listed, never loaded
        said = incomplete_said(path) if kind == "model" else f"its adapter weights are incomplete: {incomplete_adapter(path)}"
        corrupt = kind == "model" and bool(corrupt_weights(path))  # no further writing mends it: not waited for
        return Skipped(d, step, said or "its weights are incomplete",
                       "save it again" if corrupt else
                       "the save was interrupted or is still being written; rerun once it is complete",
                       pending=complete_only and not corrupt)
    return RunCheckpoint(step, path, layout if kind == "model" else "lora")


def _unmerged(step: int, d: Path, found: Located) -> Skipped:
    return Skipped(d, step, f"{len(found.shards)} FSDP shards ({found.shards[0].name}, ...) not merged into "
                            f"{found.path.relative_to(d).as_posix()}", fsdp_merge_hint(found, then="rerun the sweep"))


def _final_model(root: Path, checkpoints: list, skipped: list, complete_only: bool) -> None:
    """HF Trainer's ``save_model(output_dir)`` at the end of training: a model in the run dir itself."""
    if not ((root / "config.json").is_file() and has_weights(root)):
        return
    step = maybe_json(root / "trainer_state.json").get("global_step")
    step = step if isinstance(step, int) and not isinstance(step, bool) else None
    if step is not None and step not in {c.step for c in checkpoints}:
        if weights_complete(root):
            checkpoints.append(RunCheckpoint(step, root, "hf-trainer"))
        else:  # save_state() runs before save_model(): the step is recorded while the weights are still being written
            corrupt = bool(corrupt_weights(root))
            skipped.append(Skipped(root, step, f"the final model saved in the run dir: {incomplete_said(root) or 'its weights are incomplete'}",
                                   "save it again" if corrupt else
                                   "the save was interrupted or is still being written; rerun once it is complete",
                                   pending=complete_only and not corrupt))
        return
    reason = (f"the final model saved in the run dir, the same step as checkpoint-{step}" if step is not None
              else "the final model saved in the run dir; no trainer_state.json records its step")
    skipped.append(Skipped(root, step, reason, f"evaluate it on its own: vlmfast infer --ckpt {root}"))


def _swift_runs(runs: list[tuple[int, Path]], complete_only: bool):
    """The checkpoints of the latest ms-swift run that has any; the other runs' dirs as skipped."""
    checkpoints, skipped, latest = [], [], None
    for _, run in runs:  # newest first
        numbered = checkpoint_subdirs(run)
        if latest is not None:
            skipped += [Skipped(d, step, f"in an older ms-swift run ({run.name}); using {latest.name}",
                                f"sweep that run on its own: pass {run}") for step, d in numbered]
            continue
        found, skips = _classify_all(numbered, "ms-swift", complete_only)
        if found:
            checkpoints, latest = found, run
            skipped += skips
        elif not complete_only or skips:
            skipped.append(Skipped(run, None, "an ms-swift run with no checkpoint-N holding weights" +
                                   (f" ({skips[0].path.name}: {skips[0].reason})" if skips else ""),
                                   skips[0].hint if skips else None))
    return checkpoints, skipped


def _is_single_checkpoint(root: Path) -> bool:
    if ((root / "config.json").is_file() and has_weights(root)) or is_adapter_dir(root):
        return True
    return any((root / sub / "config.json").is_file() for sub in ("huggingface", "actor/huggingface"))
