"""``vlmfast sweep``: every checkpoint of a training run on one manifest — which step is best, and did RL help.

The run's checkpoints are found by :func:`vlmfast.checkpoints.runs.find_run_checkpoints` (HF Trainer, ms-swift,
EasyR1/verl layouts), ordered by step; ``base`` runs as step 0. Each checkpoint is one ``infer`` (same
rows, scores, resume) into its own results file in ``out_dir``. The model is loaded once: the next
checkpoint's weights are copied into it in place when the shapes allow (:mod:`vlmfast.checkpoints.swap`), so
CUDA graphs and compiled decode steps carry over; otherwise it is loaded afresh, said aloud. A killed sweep resumes
where it stopped (finished checkpoints read back, a half-done one continued); ``watch`` follows a live run.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from vlmfast.errors import EXIT_INTERRUPTED, EXIT_LESS_ACCURATE, CheckpointError, Interrupted, UsageError
from vlmfast.files import held_alone
from vlmfast.run.parallel import refuse_launched
from vlmfast.run.sweep_figures import judged_scores, step_figures
from vlmfast.run.sweep_engine import SweepEngine, files_signature, for_checkpoint, on_adapters_base, rewritten
from vlmfast.run.sweep_options import SweepOptions
from vlmfast.run.rescore import judge_all_raised, judge_failed
from vlmfast.run.search import steering_accuracy
from vlmfast.run.sweep_record import gone_steps, same_weights_notes

SCHEMA = "vlmfast.sweep/1"


@dataclass
class _Entry:
    step: int
    path: Path | str  # a hub id (a base not in the local cache) stays a string
    label: str  # "base" | the layout
    found: object = None  # the base as located (a hub id is probed once)
    place: str = ""  # "(k of N)" among the checkpoints listed at the start; "" for those found later


def sweep(options: SweepOptions, *, progress=None, say: Callable[[str], None] = lambda text: None,
          wait: Callable[[float], bool] | None = None, on_report: Callable[[dict], None] | None = None) -> dict:
    """Evaluate every checkpoint of the run (and ``base`` as step 0); the sweep report (``SCHEMA``).
    ``wait(seconds)`` (``watch`` only) returns False to stop watching; by default it sleeps. ``on_report``
    (``watch`` only) gets the report so far after the first pass and after each look that found new
    checkpoints (trackers log them while the trainer runs). A second sweep into the same ``out_dir`` is refused
    while this one runs."""
    refuse_launched("sweep")  # one process: under a launcher, before the lock (the others would be refused by it)
    with held_alone(Path(options.out_dir), "--out-dir"):
        return _checked_sweep(options, progress, say, wait, on_report)


def _checked_sweep(options: SweepOptions, progress, say, wait, on_report) -> dict:
    from vlmfast.checkpoints.runs import find_run_checkpoints
    from vlmfast.run.parity import prepare
    from vlmfast.run.runner import check_inputs, fixed_seed
    from vlmfast.run.sweep_record import check, settings_of

    out_dir = Path(options.out_dir)
    listing = find_run_checkpoints(options.run_dir, steps=options.steps, complete_only=options.watch)
    zero = next((c.path for c in [*listing.checkpoints, *listing.skipped] if c.step == 0), None)
    if options.base and zero is not None:  # one step, two models: their rows and paired figures would mix
        raise UsageError(f"--base {options.base} and {zero} are both step 0 of the sweep",
                         hint="drop --base (the run's own step 0 is the model it started from), or name the other steps "
                              "with --steps")
    # the training's settings read once (--match-training adopts them now, for every checkpoint alike); sampling
    # without --seed: one seed for every checkpoint (paired comparisons), the one its steps recorded on resume
    adopted, parity = prepare(options.infer, listing.checkpoints[-1].path if listing.checkpoints else options.run_dir)
    steps_done = sorted(out_dir.glob("*.jsonl")) if out_dir.is_dir() else []
    adopted, seed_note = fixed_seed(dataclasses.replace(adopted, match_training=False), steps_done)
    options = dataclasses.replace(options, infer=adopted)
    settings = settings_of(options.infer)
    earlier = check(out_dir, settings, options.overwrite)  # rows made with other settings: an error, before any work
    collected = check_inputs(options.infer, say)  # a missing image or a bad manifest line: said once, before any checkpoint
    if (said := options.truth_note()) is not None:  # no ground truth in the manifest: said at once
        say(said)
        earlier.append(said)
    from vlmfast.inputs.datasets import DatasetKeys
    from vlmfast.run.rescore import manifest_column

    # --by: the column's values, or an error naming the columns there are, before any work
    i = options.infer
    by = manifest_column(options.by, i.manifest, DatasetKeys(i.prompt_key, i.answer_key, i.image_key)) if options.by else None
    created = not out_dir.exists()
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        report = _sweep(options, listing, out_dir, progress, say, wait, settings, on_report, by, collected)
        report["notes"][:0], report["parity"] = earlier + ([seed_note] if seed_note else []), parity
        report.update({"by": options.by} if options.by else {})
        return report
    except BaseException:
        if created and not any(out_dir.iterdir()):  # failed before writing anything: leave no empty dir
            out_dir.rmdir()
        raise


def _sweep(options: SweepOptions, listing, out_dir: Path, progress, say, wait, settings: dict, on_report, by, collected) -> dict:
    from vlmfast.checkpoints.locate import locate
    from vlmfast.checkpoints.runs import find_run_checkpoints

    base = locate(options.base, hub=True, option="--base") if options.base else None  # a directory or a hub id, as every --base takes
    entries = [_Entry(0, base.path or base.source, "base", base)] if base else []
    entries += [_Entry(c.step, c.path, c.layout) for c in listing.checkpoints]
    for k, entry in enumerate(entries if len(entries) > 1 else []):
        entry.place = f" ({k + 1} of {len(entries)})"
    options, odd_base = on_adapters_base(options, entries)  # what is odd about --base; adapters it must carry
    for note in odd_base:
        say(note)
    models = SweepEngine(options, say)
    tables: dict[int, dict] = {}  # step → its per-request table (vlmfast.evaluation.flags.per_request)
    pages: dict[int, list[dict]] = {}  # step → its rows as its results file holds them, read once (report.html's)
    figures, notes = [], [f"skipped {s.path}: {s.reason}" + (f" ({s.hint})" if s.hint else "")
                          for s in listing.skipped if not s.pending] + odd_base
    searched, interrupted = None, False
    refused: list[dict] = []  # checkpoints not evaluated: their weights are not whole
    listed = {e.step for e in entries} | {s.step for s in listing.skipped}
    for step, out in gone_steps(out_dir, listed, options.steps, options.run_dir):  # evaluated, then deleted by the trainer
        figures.append(_gone(step, out, tables, notes, options.run_dir, pages))

    signs: dict[str, tuple] = {}  # a refused checkpoint's files as they were: --watch tries it again once they change

    def evaluate(entry: _Entry) -> float | None:
        if _refuse(entry, options, refused, notes, say):
            signs[str(entry.path)] = files_signature(entry.path)
            return None
        try:
            figures.append(_evaluate(entry, options, models, out_dir, progress, say, tables, settings, notes, by,
                                     collected, pages))
        except CheckpointError as exc:  # it does not load (an unknown model type, a broken config): go on without it
            _not_evaluated(entry, exc, refused, notes, say)
            signs[str(entry.path)] = files_signature(entry.path)
            return None
        checked, news = models.engine_news()
        figures[-1].update(checked)
        for note in news:
            say(note)
        notes.extend(news)
        return steering_accuracy(figures[-1])

    try:
        if options.search == "coarse":
            from vlmfast.run.search import coarse_every, search

            for entry in (e for e in entries if e.label == "base"):
                evaluate(entry)
            by_step = {e.step: e for e in entries if e.label != "base"}
            every = options.every or coarse_every(len(by_step))
            evaluated = search(list(by_step), lambda step: evaluate(by_step[step]), every)
            searched = {"search": "coarse", "every": every, "evaluated": sorted(evaluated),
                        "skipped": [s for s in by_step if s not in evaluated]}
        else:
            for entry in entries:
                evaluate(entry)
        waiting_on: set[str] = set()  # incomplete checkpoints already said
        broken = {str(s.path) for s in listing.skipped if not s.pending}  # skipped for good, already in the notes
        reported, watched = [], -1  # (step, fingerprint) in the last report on_report got; checkpoints in the last "watching" line
        while options.watch:
            if on_report is not None and figures and (now := [(f["step"], f.get("fingerprint")) for f in figures]) != reported:
                reported = now  # a new checkpoint, or one evaluated again after it was rewritten in place
                on_report(_report(options, figures, notes, tables, by))
            if len(figures) != watched:  # said once per new checkpoint, not at every look
                watched = len(figures)
                say(f"watching {options.run_dir}: {watched} checkpoint(s) evaluated, looking every {options.poll_s:g} s "
                    "(Ctrl-C ends the sweep)")
            if not (wait or (lambda s: time.sleep(s) or True))(options.poll_s):
                break
            seen = {f["step"] for f in figures}
            looked = find_run_checkpoints(options.run_dir, complete_only=True)
            for skipped in (s for s in looked.skipped if s.pending and str(s.path) not in waiting_on):
                waiting_on.add(str(skipped.path))
                say(f"not yet: {skipped.path} ({skipped.reason})")
            for skipped in (s for s in looked.skipped if not s.pending and str(s.path) not in broken):  # e.g. corrupt
                broken.add(str(skipped.path))
                _not_evaluated(_Entry(skipped.step, skipped.path, "skipped"),
                               CheckpointError(skipped.reason, hint=skipped.hint), refused, notes, say)
            listed = {c.step for c in looked.checkpoints}  # a broken one saved again, whole: evaluated after all
            mended = {r["path"] for r in refused if r["path"] in broken and r["step"] in listed}
            # one refused when loaded, written on since (the trainer saves the processor after the weights): again
            mended |= {r["path"] for r in refused if r["path"] in signs and r["step"] in listed
                       and files_signature(r["path"]) != signs[r["path"]]}
            broken -= mended
            notes[:] = [n for n in notes if n not in {_refused_note(f"step {r['step']}", r["reason"], r["hint"])
                                                      for r in refused if r["path"] in mended}]
            refused[:] = [r for r in refused if r["path"] not in mended]
            seen |= {r["step"] for r in refused}
            for c in rewritten(looked.checkpoints, figures, options):  # saved again in place: its rows are stale
                figures[:] = [f for f in figures if f["step"] != c.step]
                seen.discard(c.step)
            for c in (c for c in looked.checkpoints if c.step not in seen):
                evaluate(_Entry(c.step, c.path, c.layout))  # as the first pass: refused or failing to load, said and passed
    except (KeyboardInterrupt, Interrupted):  # Ctrl-C (--watch's way to stop) between or inside a checkpoint's run
        interrupted = True
        notes.append("interrupted: the finished checkpoints are reported; rerun the same command"
                     + (" without --overwrite (with it, their results are moved aside)" if options.overwrite else "")
                     + " to go on")
    finally:
        models.close()
    if not figures and refused and not interrupted:  # not a sweep's result: every checkpoint was refused or skipped
        why = [(s.step, f"{s.path}: {s.reason}") for s in listing.skipped if not s.pending]
        why = sorted([*why, *((r["step"], r["reason"]) for r in refused)], key=lambda w: (w[0] is None, w[0] or 0))
        listing_ = "\n".join(f"  - step {step}: {reason}" for step, reason in why[:20])
        raise CheckpointError(f"no checkpoint of {options.run_dir} could be evaluated:\n{listing_}",
                              hint=refused[0].get("hint") or "see each reason above (vlmfast doctor CHECKPOINT says more)",
                              problems=[f"step {step}: {reason}" for step, reason in why])
    from vlmfast.run.sweep_page import SweepReport

    report = SweepReport(_report(options, figures, notes, tables, by), rows_by_step=pages)
    if interrupted and not options.watch:  # stopped by hand: exit 130 and --json's error object, the gate not judged
        report.update(interrupted=True, gate=None, exit_code=EXIT_INTERRUPTED, error={"message": notes[-1], "problems": [],
                      "hint": "rerun the same command to go on", "exit_code": EXIT_INTERRUPTED})
    report["interrupted"] = report.get("interrupted") or interrupted  # --watch ends so: its gate judged as it stands
    from vlmfast.timing import versions

    # every checkpoint directory not evaluated: those the listing skipped (no weights yet, a save cut short)
    # and those refused for lost tensors
    done = {f["step"] for f in figures if f["label"] != "base"}  # skipped at first, then saved whole under --watch
    skipped = [{"step": s.step, "path": str(s.path), "reason": s.reason, "hint": s.hint} for s in listing.skipped
               if not s.pending and s.step is not None and s.step not in done]
    report.update(settings=settings, versions=versions(), not_evaluated=skipped + refused)
    if searched is not None:
        report["search"] = searched
        if searched["skipped"]:
            report["notes"].append(f"--search coarse evaluated {len(searched['evaluated'])} of "
                                   f"{len(searched['evaluated']) + len(searched['skipped'])} checkpoints (skipped steps "
                                   f"{', '.join(map(str, searched['skipped']))}); a plain sweep into the same --out-dir "
                                   "evaluates only those")
    return report


def _gone(step: int, out: Path, tables: dict, notes: list[str], run_dir: str, pages: dict) -> dict:
    """A step evaluated earlier whose checkpoint is no longer in the run (``save_total_limit`` deletes old ones):
    its finished rows reported as they were, marked ``gone``, said. Left out, a rerun or a restarted ``--watch``
    lost the best step (a gate then failed on the rest) and the trackers' history of it."""
    from types import SimpleNamespace

    from vlmfast.evaluation.flags import per_request, reward_errors_as_wrong
    from vlmfast.run.results import read_existing
    from vlmfast.run.sweep_record import measured, recorded_path

    pages[step] = list(read_existing(out, repair=False)[0].values())
    rows, _ = reward_errors_as_wrong(pages[step])
    tables[step] = per_request(rows)
    path = recorded_path(out) or f"{run_dir} (step {step}, deleted)"
    notes.append(f"step {step}: its checkpoint is no longer in {run_dir} ({path}: deleted after it was evaluated, e.g. "
                 f"by save_total_limit); its rows in {out.name} are reported as they were")
    unmeasured = SimpleNamespace(tokens_per_s=None)
    return {**step_figures(_Entry(step, path, "gone"), out, rows, unmeasured, "none", 0.0, tables[step]), **measured(out),
            "read_back": True, "gone": True}


def _refuse(entry: _Entry, options: SweepOptions, refused: list[dict], notes: list[str], say) -> bool:
    """True (and the reason recorded and said) when the checkpoint's weights are not whole: the sweep goes on."""
    from vlmfast.checkpoints.locate import locate
    from vlmfast.checkpoints.weights import require_whole

    try:
        require_whole(locate(entry.path), options.infer.allow_missing or (), options.infer.engine)
    except CheckpointError as exc:
        _not_evaluated(entry, exc, refused, notes, say)
        return True
    return False


def _not_evaluated(entry: _Entry, exc, refused: list[dict], notes: list[str], say) -> None:
    """A checkpoint the sweep goes on without: its reason recorded (the report's not_evaluated) and said."""
    reason = exc.message if len(exc.message) <= 300 else exc.message[:297] + "…"  # a loader's may list every model
    refused.append({"step": entry.step, "path": str(entry.path), "reason": reason, "hint": exc.hint})
    label = "base" if entry.label == "base" else f"step {entry.step}"
    notes.append(_refused_note(label, reason, exc.hint))
    say(notes[-1])


def _refused_note(label: str, reason: str, hint: str | None) -> str:
    """A checkpoint not evaluated, as the notes say it: the reason and what to do, as a skipped dir's note."""
    return f"{label} not evaluated: {reason}" + (f" ({hint})" if hint else "")


def _evaluate(entry: _Entry, options: SweepOptions, models: SweepEngine, out_dir: Path, progress, say, tables,
              settings: dict, notes: list[str], by: dict | None, collected, pages: dict) -> dict:
    """One checkpoint's run (resumed from its results file if there is one) and its figures; its per-request
    table goes into ``tables``, and its rows as the file holds them into ``pages`` (report.html shows them: read
    once, from infer, not back from the file). ``collected``: the sweep's inputs, checked once."""
    from vlmfast.checkpoints.locate import locate
    from vlmfast.evaluation.flags import per_request, reward_errors_as_wrong
    from vlmfast.run.runner import infer

    out = out_dir / ("base.jsonl" if entry.label == "base" else f"step-{entry.step}.jsonl")
    found = entry.found or locate(entry.path)
    say(f"step {entry.step}: {entry.path}{entry.place}")
    from vlmfast.checkpoints.fingerprint import weights_fingerprint
    from vlmfast.run.sweep_record import forget_if_changed

    weights_id = weights_fingerprint(found, options.infer.fingerprint, options.infer.base)
    if changed := forget_if_changed(out, weights_id, entry.path):
        say(changed)
        notes.append(changed)
    models.how = None
    report = infer(dataclasses.replace(for_checkpoint(options.infer, found), ckpt=str(entry.path), out=str(out),
                                       retry_errors=options.retry_errors),
                   progress=progress, backend=models.at(found), weights_id=weights_id, collected=collected,
                   rows_to=(rows := []).extend, scores_of=judged_scores)  # the step's one summary: report.scores
    pages[entry.step] = rows  # the rows finalize left in the file (a step evaluated again replaces them)
    how, seconds = models.how or ("none", 0.0)  # none: every row was already there
    rows, raised = reward_errors_as_wrong(rows)
    notes += [f"step {entry.step}: {raised} answer(s) the reward function raised on (--skip-bad) count as wrong"] * bool(raised)
    tables[entry.step] = per_request(rows)
    from vlmfast.evaluation.samples import identical_answers_note

    same = identical_answers_note(rows, options.infer.generation.temperature) if options.infer.generation.n > 1 else None
    if same:
        notes.append(f"step {entry.step}: {same}")
    figures = step_figures(entry, out, rows, report, how, seconds, tables[entry.step], report.scores)
    if by is not None:  # --by: accuracy per value of the column, answers a reward raised on counted wrong as above
        from vlmfast.evaluation.stats import group_accuracy

        figures["by"] = group_accuracy(rows, by, options.by)
    from vlmfast.run.sweep_record import MEASURED, fingerprint_figures, measured, record
    figures.update(fingerprint_figures(weights_id))  # an adapter's covers its base's weights, or says it does not

    if report.samples == 0 and (kept := measured(out)):  # read back, nothing measured: the figures of when it ran
        figures = {**{k: v for k, v in figures.items() if k not in MEASURED}, **kept, "read_back": True}
    else:
        record(out, settings, figures)
    return figures


def _report(options: SweepOptions, figures: list[dict], notes: list[str], tables: dict[int, dict], by=None) -> dict:
    from vlmfast.evaluation.best import held_up, undistinguished_note, unscored_note
    from vlmfast.evaluation.flags import compare, flag_run

    groups = (by, options.by) if by is not None else None  # --by's groups are judged again with the rest
    notes = notes + judge_all_raised(figures, tables, groups) + judge_failed(figures, tables, groups)  # as wrong: ranked on one request set
    ranked = [f for f in figures if f["accuracy"] is not None]
    best = max(ranked, key=lambda f: (f["accuracy"], -f["step"])) if ranked else None  # ties: the earlier step
    base = next((f for f in figures if f["label"] == "base"), None)
    for f in figures:  # paired against base and the best, over the requests both scored
        f["vs_base"] = compare(tables[f["step"]], tables[base["step"]]) if base and f is not base else None
        f["vs_best"] = compare(tables[f["step"]], tables[best["step"]]) if best and f is not best else None
    held = held_up(best, ranked, tables)
    notes = notes + undistinguished_note(best, figures, held) + unscored_note(figures) + same_weights_notes(figures)
    gate = None
    if options.fail_if_best_below is not None:
        failed = best is None or best["accuracy"] < options.fail_if_best_below
        gate = {"fail_if_best_below": options.fail_if_best_below, "failed": failed,
                "message": (f"best accuracy {best['accuracy'] if best else 'none (no ground truth?)'} is below "
                            f"{options.fail_if_best_below}") if failed else None}
    return {
        "schema": SCHEMA, "run_dir": options.run_dir, "out_dir": options.out_dir, "manifest": options.infer.manifest,
        "checkpoints": sorted(figures, key=lambda f: f["step"]),
        "best": {"step": best["step"], "label": best["label"], "path": best["path"], "accuracy": best["accuracy"],
                 **({"p_best": held["p_best"].get(best["step"]), "indistinguishable": held["indistinguishable"],
                     "requests": held["requests"], "comparisons": held["comparisons"], "alpha": held["alpha"],
                     "resamples": held["resamples"]} if held else {})}
        if best else None,
        "gate": gate, "exit_code": EXIT_LESS_ACCURATE if gate and gate["failed"] else 0, "notes": notes,
        "flags": flag_run(figures, tables, base_step=base["step"] if base else None),
    }


def publish(report: dict, options: SweepOptions, *, trackers=None) -> list[str]:
    """The figures to TensorBoard and W&B when asked (``--tensorboard``, ``--wandb``); what was done, one
    line each. ``trackers`` (a :class:`vlmfast.report.trackers.Trackers`, left open for the caller to close):
    the one a ``watch`` sweep logged to as it went, so its W&B run gets only the steps it lacks."""
    from vlmfast.report.trackers import log_trackers

    if trackers is not None:
        return trackers.log(report)
    if options.tensorboard is None and options.wandb is None:
        return []
    return log_trackers(report, tensorboard=options.tensorboard, wandb=options.wandb)
