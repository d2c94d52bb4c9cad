"""``infer`` as a library call, step by step:

locate the checkpoint → collect inputs (and what an earlier run already wrote) → open the engine →
drop prompts longer than the context → get ready (batch size; vLLM starts) → run the batches (each
written, fsync'd and scored as it finishes) → gather the processes' rows → finalize the file → report.

The CLI builds :class:`~vlmfast.run.options.InferOptions` and renders the :class:`~vlmfast.run.summary.InferReport`;
Python users call :func:`infer` directly and get the same numbers and rows.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from pathlib import Path
from typing import Protocol

from vlmfast.errors import VlmfastError
from vlmfast.inputs.requests import BadInput, Collected, Problem, raise_for_problems
from vlmfast.run.options import InferOptions, VllmSettings  # the options of infer, importable from here
from vlmfast.run.parallel import Distributed, fail_together
from vlmfast.evaluation.rewards import load_rewards
from vlmfast.run.results import ResultsWriter, clear_out, finalize, interrupted, part_path, resume_hint
from vlmfast.run.work import Work, check_inputs, collect_work  # what a run has to do, importable from here too
from vlmfast.engines.rows import BatchTiming, SampleResult, error_row, of_samples, row_key
from vlmfast.run.summary import InferReport, Share, summarize
from vlmfast.timing import peak_memory_mib, reset_peak_memory

__all__ = ["InferOptions", "Progress", "VllmSettings", "Work", "check_inputs", "collect_work", "drop_too_long",
           "fixed_seed", "infer", "run_batches", "score_rows"]


class Progress(Protocol):
    def start(self, total: int) -> None: ...  # answers to come: requests × answers per request
    def advance(self, answers: int, new_tokens: int) -> None: ...
    # optional: note(text), what the run is doing before its first answer (loading, resuming)


def infer(options: InferOptions, progress: Progress | None = None, loaded=None, backend=None, weights_id=None,
          collected: Collected | None = None, rows_to=lambda rows: None, scores_of=None) -> InferReport:
    """Run the whole ``infer`` flow. Raises :class:`~vlmfast.errors.VlmfastError` subclasses for anything
    the user can fix; nothing is written when inputs are bad (unless ``skip_bad``). A second run onto the
    same ``out`` is refused while this one runs (:func:`vlmfast.files.held_alone`).

    Launched with several processes (``accelerate launch``), each process runs its share and the main
    process returns the combined report (the others return their own). ``loaded``: a model already loaded
    for these options; ``backend``: an engine already opened (any :class:`~vlmfast.engines.contract.Backend`);
    ``weights_id``: with one of them, the fingerprint of the weights it runs (a sweep's), recorded beside
    ``out`` before the first row so that a run killed mid-way is resumed only onto the same weights. A sweep hands in
    ``collected`` (its inputs, checked once), ``rows_to`` (called with the rows ``out`` holds once finished) and
    ``scores_of`` (what makes the report's ``scores`` from those rows, in place of
    :func:`vlmfast.evaluation.stats.summarize`: the sweep's figures, so that they are made once)."""
    from vlmfast.files import held_alone
    from vlmfast.run.parallel import is_main_process

    alone = options.out is not None and is_main_process()
    with held_alone(Path(options.out), "--out") if alone else contextlib.nullcontext():
        return _infer(options, progress, loaded, backend, weights_id, collected, rows_to, scores_of)


def _infer(options: InferOptions, progress: Progress | None, loaded, backend, given_id, collected, rows_to,
           scores_of) -> InferReport:
    from vlmfast.engines.open import check_machine, open_backend
    from vlmfast.engines.facts import EngineFacts
    from vlmfast.checkpoints.locate import locate
    from vlmfast.checkpoints.fingerprint import weights_fingerprint
    from vlmfast.checkpoints.weights import require_whole

    from vlmfast.run.parity import prepare

    found = locate(options.ckpt, hub=True) if loaded is None and backend is None else None  # fails in well under a second
    # a broken config.json, cut weight files, lost tensors: refused before anything is written or torch is imported
    weights = require_whole(found, options.allow_missing or (), options.engine)
    # what a resume is checked against (a sweep's engine: the fingerprint the sweep took of the checkpoint)
    weights_id = weights_fingerprint(found, options.fingerprint, options.base) if found is not None else given_id
    options, parity = prepare(options, found)  # --match-training: before inputs
    dist = Distributed(gloo=options.engine == "vllm")  # vLLM's engines take the GPUs, one per process
    options, seed_note = fixed_seed(options, agree=dist.reduce_max)  # one seed for every process
    reward = load_rewards(options.reward, weights=options.reward_weights, kwargs=options.reward_kwargs,
                          threshold=options.reward_threshold) if options.reward else None  # fails early
    settings = _settings(options, found)
    if settings is not None and not options.overwrite:
        from vlmfast.run.sweep_record import refuse_other_weights

        refuse_other_weights(Path(options.out), weights_id, settings)  # a resume onto rows other weights made
    say = getattr(progress, "note", None) if dist.is_main else None  # what the run is doing, on the main process
    work = collect_work(options, dist, settings, found.path if found is not None and found.is_local else None, reward, say,
                        collected)
    work = dataclasses.replace(work, notes=work.notes + [n for n in (seed_note, getattr(reward, "note", None)) if n])
    if weights is not None and weights.allowed:
        lost = ", ".join(f"{g.label}: {g.count}" for g in weights.allowed)
        work = dataclasses.replace(work, notes=[f"tensors missing as --allow-missing allows ({lost}): the model runs "
                                                "with them initialised at random"] + work.notes)
    if reward is not None and not options.skip_bad:  # --skip-bad records reward failures per row instead
        reward.check(work.todo)  # user code that cannot be called fails now, not after a batch has generated
    if not work.todo and not work.bad:  # everything was done by an earlier run: nothing to load
        check_machine(options, dist, opened=loaded is not None or backend is not None)  # what loading would refuse
        rows = list(work.existing.values())
        if dist.is_main and options.out is not None:  # the kept rows scored against today's ground truth
            rows = finalize(Path(options.out), work.order, work.existing)  # as the file holds them, in its order
            rows_to(rows)
        report = summarize(options, EngineFacts.nothing_loaded(options, found), [Share(dist.rank, "none")], work,
                           rows=rows, batch_size=options.batch_size or 0, scores_of=scores_of)
        report.notes.insert(0, f"nothing to do: {len(work.existing)} row(s) already in {options.out}, the model was not "
                               "loaded (--overwrite runs them again)")
        report.parity = parity
        report.fingerprint = weights_id
        return report
    owned = backend is None  # a backend handed in (a sweep's, kept across checkpoints) stays open
    if say is not None:  # before the load, a run's longest silence
        for line in [n for n in work.notes if n.startswith("resuming: ")] + _loading(found, loaded, owned, weights_id):
            say(line)
    with contextlib.closing(open_backend(options, found, loaded, dist)) if owned else contextlib.nullcontext(backend) as backend:
        work = drop_too_long(backend, work, options.skip_bad)  # same verdict on every process
        batch_size, said = backend.ready(work.todo, work.image_sizes, options.batch_size)
        said = [said]
        if options.overwrite and dist.is_main:  # inputs checked, the model ready: only now the old rows go
            clear_out(Path(options.out))
        runtime = {k: getattr(backend.facts(), k) for k in ("engine", "device", "dtype", "repetition_penalty")}
        refusal = None
        if settings is not None and dist.is_main and (options.overwrite or not work.existing):
            from vlmfast.run.sweep_record import fingerprint_figures, manifest_state, record

            # what made the rows to come, the weights' fingerprint too: a resume is checked against them
            record(Path(options.out), settings, {**fingerprint_figures(weights_id), "runtime": runtime,
                                                 "manifest": manifest_state(options.manifest)})
        elif settings is not None and dist.is_main:
            from vlmfast.run.sweep_record import refuse_other_penalty, runtime_note

            try:
                refuse_other_penalty(Path(options.out), runtime.pop("repetition_penalty"))  # before a row is written
            except VlmfastError as exc:
                refusal = exc
            said.append(runtime_note(Path(options.out), runtime))  # a resume on another device or dtype
        dist.settle(refusal)
        dist.barrier()  # no process writes a row before the old ones are gone
        work = dataclasses.replace(work, notes=work.notes + [n for n in said if n])
        compiled_before = backend.facts().compile_s  # an engine kept across runs (a sweep's) compiled before
        mine = run_batches(backend, options, work, batch_size, dist, progress, reward)
        facts = backend.facts()
        facts = dataclasses.replace(facts, compile_s=facts.compile_s - compiled_before)  # this run's share only
    dist.barrier()
    gathered = dist.gather(mine)  # a collective: every process takes part (a no-op for one process)
    everyone = gathered if dist.is_main else [mine]  # the others report their own share
    rows = [r.record() for share in everyone for r in share.results]
    if options.out is not None and dist.is_main:
        rows = finalize(Path(options.out), work.order, {**work.existing, **{row_key(r["id"], r.get("sample")): r for r in rows}})
        rows_to(rows)
    report = summarize(options, facts, everyone, work, rows=rows, batch_size=batch_size, scores_of=scores_of)
    report.processes = [share.figures() for share in everyone] if dist.world > 1 else []
    report.parity = parity
    report.fingerprint = weights_id
    return report


def _loading(found, loaded, owned: bool, weights_id: dict | None) -> list[str]:
    """"loading CKPT (N GiB of weights)" when this run loads a model itself, else nothing."""
    if not owned or loaded is not None or found is None:
        return []
    size = weights_id["bytes"] if weights_id else None
    size = "" if size is None else f" ({size / 2**30:,.1f} GiB of weights)" if size >= 2**30 else f" ({size / 2**20:,.1f} MiB of weights)"
    return [f"loading {found.path if found.is_local else found.source}{size}"]


def fixed_seed(options: InferOptions, results: list[Path] | None = None, agree=None) -> tuple[InferOptions, str | None]:
    """Sampling without ``--seed``: the seed this run draws with, fixed before any row is made and recorded
    with the run's settings — the one an earlier run recorded beside its results (``--out``, or ``results``:
    a sweep's step files) when this run resumes it, so old and new rows draw alike; else a new one, made the
    same on every process by ``agree`` (the largest drawn). Returns the options carrying it and what to say."""
    from vlmfast.engines.rows import run_seed

    generation = options.generation
    if generation.greedy or generation.seed is not None:
        return options, None
    recorded = None
    if (options.out is not None or results) and not options.overwrite:
        from vlmfast.run.sweep_record import recorded_seed

        recorded = recorded_seed(results if results is not None else [Path(options.out)])
    seed = recorded if recorded is not None else run_seed(None)
    seed = agree(seed) if agree is not None else seed
    said = (f"--seed {seed}: the seed the earlier rows were drawn with, kept for the rows to come"
            if recorded is not None else f"--seed {seed} drawn for this run: pass it to draw the same answers again")
    return dataclasses.replace(options, generation=dataclasses.replace(generation, seed=seed)), said


def _settings(options: InferOptions, found) -> dict | None:
    """What shapes a run's rows (a sweep's settings, and the checkpoint): recorded beside ``--out`` (None
    without one)."""
    from vlmfast.run.sweep_record import settings_of

    if options.out is None:
        return None

    if found is not None:
        ckpt = str(found.path.resolve()) if found.is_local else found.source
    else:  # an engine handed in: the checkpoint as named
        ckpt = str(Path(options.ckpt).resolve()) if Path(options.ckpt).exists() else options.ckpt
    # the inputs themselves may grow between runs (more images, more manifest lines: new ids to run)
    inputs = ("images", "manifest", "manifest_sha256")
    return {"ckpt": ckpt, **{k: v for k, v in settings_of(options, digest=False).items() if k not in inputs}}


def drop_too_long(backend, work: Work, skip_bad: bool) -> Work:
    """Prompts (text + image tokens) that leave no room in the model's context: an error before anything
    runs, or error rows with ``skip_bad``."""
    too_long = backend.context_problems(work.todo, work.image_sizes)
    if not too_long:
        return work
    long_bad = [BadInput(r.id, (Problem(r.id, too_long[r.id]),), r) for r in work.todo if r.id in too_long]
    if not skip_bad:
        raise_for_problems(Collected(requests=[], bad=long_bad))
    return dataclasses.replace(work, todo=[r for r in work.todo if r.id not in too_long], bad=work.bad + long_bad)


def run_batches(backend, options: InferOptions, work: Work, batch_size: int, dist: Distributed, progress,
                reward=None) -> Share:
    """This process's share: error rows first, then every batch — written (fsync'd) and scored as it
    finishes. Each batch boundary is a collective check, so a failure on any process ends the run on
    every process at once, with the rows written so far kept for a resume."""
    my_todo, my_bad = dist.split(work.todo), dist.split(work.bad)
    planned = backend.plan(my_todo, work.image_sizes, batch_size)
    rounds = dist.reduce_max(len(planned))  # every process takes part in every boundary check
    out = Path(options.out) if options.out is not None else None
    writer = ResultsWriter(part_path(out, dist.rank) if dist.world > 1 else out, stdout=options.rows_to_stdout)
    position = {rid: i for i, rid in enumerate(work.order)}
    truths = {r.id: r.truth_record() for r in my_todo}
    results: list[SampleResult] = []
    timings: list[BatchTiming] = []
    n = options.generation.n

    def emit(rows: list[SampleResult], new_tokens: int) -> None:
        rows = [r for r in of_samples(rows, n) if r.key not in work.answered]
        if not rows:  # a timing alone (continuous batching: an admission): nothing written, no progress
            return
        score_rows(rows, truths, options, reward)  # a reward function that raises: nothing of the batch is written
        try:
            writer.write([r.record() for r in rows], [position[r.id] * n + (r.sample or 0) for r in rows])
        except OSError as exc:  # a full disk, a folder gone: the rows before are whole on disk
            if out is None or isinstance(exc, BrokenPipeError):  # rows to stdout, its reader gone: not a disk's matter
                raise
            raise VlmfastError(f"cannot write to {out}: {exc.strerror or exc} ({len(results)} answer(s) written before)",
                               hint="free space (or give another --out), then " + resume_hint(options.overwrite)) from exc
        results.extend(rows)
        if progress:
            progress.advance(len(rows), new_tokens)

    memory = backend.device if backend.facts().peak_mem_kind is None else "cpu"  # vLLM's model in its own processes:
    reset_peak_memory(memory)  # this process's memory then, and no CUDA context started here for nothing
    if progress:
        progress.start((len(my_todo) + len(my_bad)) * n - len(work.answered))
    start = time.perf_counter()
    failure = None
    with contextlib.closing(backend.batches(my_todo, work.image_sizes, planned)) as stream:
        try:
            if my_bad:
                emit([error_row(b.id, b.request, b.error) for b in my_bad], 0)
            for k in range(rounds):
                if failure is None and k < len(planned):
                    try:
                        for _, rows, timing in next(stream):
                            emit(rows, sum(r.n_new_tokens for r in rows if not r.copied))
                            timings += [timing] if timing else []
                    except Exception as exc:  # noqa: BLE001 - reported collectively below
                        failure = exc
                if dist.any(failure is not None):
                    break
        except KeyboardInterrupt:  # in a batch, or waiting at a boundary for the other processes
            held = writer.release_held() if out is None else 0
            raise interrupted(len(results), out, held, options.overwrite,
                               written_to=writer.path if dist.world > 1 else None) from None
        finally:
            writer.close()
    if dist.world > 1 and dist.any(failure is not None):
        fail_together(dist, failure, out, options.overwrite)
    elif failure is not None:
        raise failure
    return Share(dist.rank, backend.device, results, timings, time.perf_counter() - start, peak_memory_mib(memory))


def score_rows(rows: list[SampleResult], truths: dict, options: InferOptions, reward=None) -> None:
    """The scoring fields of each row: the trainer's ``reward`` function when given (vlmfast.evaluation.rewards), else
    the built-in scorers (vlmfast.evaluation.scoring); nulls where there is no ground truth."""
    from vlmfast.evaluation.scoring import score_row

    if reward is not None:
        records = [{**r.record(), "token_ids": r.token_ids} for r in rows]  # TRL hands reward functions the ids
        for r, fields in zip(rows, reward.score_rows(records, truths, skip_bad=options.skip_bad)):
            r.extra = fields
        return
    for r in rows:
        truth = truths.get(r.id, {})
        r.extra = score_row(r.record(), truth.get("ground_truth"), truth.get("scorer") or options.scorer, iou=options.iou,
                            bbox_space=options.bbox_space, as_written=truth.get("reference_truth"))
