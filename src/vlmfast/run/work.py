"""What an ``infer`` run has to do, found before any model loads: its inputs checked (every problem at once),
``--out`` prepared, and the ids an earlier run already finished there left out (a resume)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from vlmfast.errors import UsageError, VlmfastError
from vlmfast.files import holds_rows, refuse_inputs_as_out
from vlmfast.inputs.datasets import DatasetKeys
from vlmfast.inputs.requests import BadInput, Collected, Request, collect, raise_for_problems
from vlmfast.run.options import InferOptions
from vlmfast.run.parallel import Distributed
from vlmfast.run.results import prepare_out, read_existing, recheck_kept, renamed_legacy_ids
from vlmfast.engines.rows import row_key


@dataclass(frozen=True)
class Work:
    """What this run has to do: requests to generate, bad inputs to record (``--skip-bad``), every id in
    input order, the rows an earlier run already wrote to ``--out``, and what was found on the way."""

    todo: list[Request]
    bad: list[BadInput]
    order: list[str]
    image_sizes: dict
    existing: dict[str, dict]
    skipped: int
    notes: list[str]
    answered: frozenset[str] = frozenset()  # row keys of answers an earlier run gave to requests still to do



def check_inputs(options: InferOptions, say=None) -> Collected:
    """The run's requests, every input problem raised at once (a :class:`~vlmfast.errors.InputError`) unless
    ``skip_bad`` — before any model loads; a sweep checks them before its first checkpoint. ``say``: called
    with a line before a check that takes noticeable time (:func:`~vlmfast.inputs.records.check_images`)."""
    collected = collect(
        images=options.images, prompt=options.prompt, prompt_file=options.prompt_file, manifest=options.manifest,
        template=options.template, system=options.system, max_image_pixels=options.max_image_pixels,
        keys=DatasetKeys(options.prompt_key, options.answer_key, options.image_key), format_prompt=options.format_prompt,
        image_root=options.image_root, say=say,
    )
    raise_for_problems(collected, skip_bad=options.skip_bad)
    return collected


def _still_as_checked(collected: Collected, max_image_pixels: int | None) -> bool:
    """Whether inputs checked earlier (a sweep's, before its first step) still hold for this run: no bad inputs
    among them, and every image still the file of the size checked (a stat each while unchanged: the check is
    cached by size and modification time). An image deleted or replaced since, during a long ``--watch``, has
    the inputs checked again, as a run of their own would."""
    from vlmfast.inputs.records import check_images

    if collected.bad:
        return False
    sizes, problems = check_images([p for r in collected.requests for p in r.images], max_image_pixels)
    return not problems and all(sizes.get(p) == s for r in collected.requests for p, s in zip(r.images, r.image_sizes or ()))


def collect_work(options: InferOptions, dist: Distributed, settings: dict | None = None, ckpt_dir: Path | None = None,
                 reward=None, say=None, collected: Collected | None = None) -> Work:
    """Inputs checked (all problems at once, before any model loads) and, with ``--out``, the ids an
    earlier run already finished: those are skipped (error rows redone with ``retry_errors``). ``settings``:
    the run's (:func:`_settings`); rows already in ``--out`` made with others are an error, as in a sweep.
    ``--out`` naming an input (the manifest, the prompt file, an image, a file of ``ckpt_dir``) is an error.
    ``say``: what the check is doing, when it takes a while (:func:`check_inputs`). ``collected``: the inputs
    already checked (a sweep's, before its first step): not checked again."""
    if collected is None or not _still_as_checked(collected, options.max_image_pixels):
        collected = check_inputs(options, say)
    if options.out is not None:
        inputs = dict.fromkeys([options.manifest, options.prompt_file, *(p for r in collected.requests for p in r.images)])
        refuse_inputs_as_out("--out", Path(options.out), [Path(p) for p in inputs if p], ckpt_dir)  # each path once
    if dist.world > 1 and options.out is None:
        raise UsageError(f"{dist.world} processes need a results file", hint="add --out results.jsonl")
    notes = list(collected.warnings)
    if options.generation.n > 1 and options.generation.greedy:
        notes.append(f"--n {options.generation.n} with greedy decoding gives {options.generation.n} identical answers "
                     "per request: add --temperature (e.g. 1.0) to sample")
    if options.generation.greedy and options.generation.top_p < 1.0:
        notes.append(f"--top-p {options.generation.top_p:g} applies to sampling: greedy decoding ignores it "
                     "(add --temperature, e.g. 1.0, to sample)")
    if options.images and options.manifest:
        notes.append(f"--images and --manifest together: the run takes the requests of both "
                     f"({len(collected.order)} in all)")
    existing: dict[str, dict] = {}
    out = Path(options.out) if options.out is not None else None
    if out is not None:
        if dist.world > 1 and not options.overwrite:
            read_existing(out, repair=False)  # a file that is not ours fails every process alike, not just the main one
        refusal = None
        try:
            if dist.is_main:
                existing = _main_prepares_out(out, options, settings, notes)
        except VlmfastError as exc:
            refusal = exc
        dist.settle(refusal)  # the main process's verdict, on every process
        dist.barrier()  # every process reads the same, repaired file
        if not dist.is_main and not options.overwrite:
            existing, _ = read_existing(out, repair=False)
        existing = renamed_legacy_ids(existing, collected.requests, notes if dist.is_main else [],
                                      bad_ids=[b.id for b in collected.bad])
        notes += recheck_kept(existing, collected.requests, out, options, reward, write=dist.is_main) \
            if not options.overwrite and existing else []
    n = options.generation.n
    kept = [row for row in existing.values() if not (options.retry_errors and row.get("error") is not None)]
    answers = {}  # id → how many of its n answers the file holds (a request is done with all n)
    for row in kept:
        if (row.get("sample") is None) == (n == 1):
            answers[str(row["id"])] = answers.get(str(row["id"]), 0) + 1
    done = {rid for rid, count in answers.items() if count >= n}
    have: dict[str, set] = {}  # id → the samples a request that is not done already has
    for row in kept:
        if str(row["id"]) in answers and str(row["id"]) not in done and row.get("error") is None:
            have.setdefault(str(row["id"]), set()).add(row.get("sample") or 0)
    todo = [dataclasses.replace(r, answered=frozenset(have[r.id])) if r.id in have else r
            for r in collected.requests if r.id not in done]
    bad = [b for b in collected.bad if b.id not in done]
    skipped = len(collected.order) - len(todo) - len(bad)
    if skipped and (todo or bad):  # with nothing left, the run says "nothing to do" instead
        notes.append(f"resuming: {skipped} id(s) already in {options.out} were skipped (--overwrite redoes them)")
    # a request that has some of its n answers runs again for the others (static batches decode all n);
    # the answers it has are kept, not given twice
    answered = frozenset(row_key(row["id"], row.get("sample")) for row in kept if str(row["id"]) in answers
                         and str(row["id"]) not in done and row.get("error") is None)
    return Work(todo, bad, collected.order, collected.image_sizes, existing, skipped, notes, answered)


def _main_prepares_out(out: Path, options: InferOptions, settings: dict | None, notes: list[str]) -> dict[str, dict]:
    """Main process: refuse rows made with other settings, then repair ``out`` and fold in part files."""
    if settings is not None and not options.overwrite and holds_rows(out):  # part files too: a parallel run's
        from vlmfast.run.sweep_record import compare, sidecar

        if not sidecar(out).is_file():  # rows printed to stdout, or moved without their record
            raise UsageError(f"{out} holds rows but not the record of the settings and weights that made them "
                             f"({sidecar(out).name}): resuming could mix the answers of two models or prompts",
                             hint="rerun with --overwrite to redo them, or give another --out (--out-dir for a "
                                  "sweep; a run given --out writes the record beside its rows)")
        said = compare(sidecar(out), settings, f"{out} holds rows made with other settings "
                       f"({sidecar(out).name})", hint="rerun with --overwrite to redo them, or give another --out")
        notes += [f"{out}: {said}"] if said else []
    existing, said = prepare_out(out, overwrite=options.overwrite)
    notes += said
    return existing
